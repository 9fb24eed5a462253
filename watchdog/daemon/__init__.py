"""The node's judge: the scan loop, rank records, detector, enforcer, probes, journal, config."""
