"""The docs keep their promises: README, alerting rules, dashboard."""
