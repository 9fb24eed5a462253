"""The daemon's files: the incident journal and reboot flag, the write-ahead entries of
responses, what the auto deadline learned, the launcher's journal, and the safety of
the two directories."""
