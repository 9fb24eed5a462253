"""The node's watchdog: the scan loop and the rank table on top; judge/ (the verdict),
act/ (the response), store/ (its files) and the seams (probes/, signaller.py) below."""
