"""What other machines and the service manager talk to.

Metrics and HTTP, asking the other nodes' /status (judged in daemon/judge/cluster.py),
fences between daemons, sd_notify.
"""
