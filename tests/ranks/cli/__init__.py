"""The command line end to end: the demo and the relaunching launcher."""
