"""Judging a rank, purely: the detector, the deadline of a wait and its rules, and a
rank's threads between two samples. No I/O: the loop hands in what it saw."""
