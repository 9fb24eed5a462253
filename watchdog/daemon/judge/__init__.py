"""Judging a rank: the detector (pure), the deadline of a wait, a rank's threads between
two samples, what the auto deadline learned, and the slow-peer hold."""
