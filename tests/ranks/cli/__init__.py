"""The command line end to end: the demo, status, a node waiting to be healthy."""
