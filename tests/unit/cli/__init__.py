"""The command line: status, doctor, services, the commands' layout."""
