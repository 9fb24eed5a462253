"""The daemon's files: the incident journal, the write-ahead entries of responses, the
launcher's journal, and the safety of the two directories."""
