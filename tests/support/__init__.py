"""Helpers of the tests and the benchmarks: real ranks and daemons, fakes, other users,
and the programs the tests run as subprocesses by path."""
