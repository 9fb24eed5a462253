"""Judging, purely: a rank (the detector, the deadline of a wait and its rules, a rank's
threads between two samples) and a job across the nodes (cluster.py). No I/O: the loop,
the peers' asking and `cluster status` hand in what they saw."""
