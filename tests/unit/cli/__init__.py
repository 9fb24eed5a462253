"""The command line: status, doctor, services, the launcher."""
