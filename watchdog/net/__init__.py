"""What other machines and the service manager talk to.

Metrics and HTTP, the cluster view, fences between daemons, sd_notify.
"""
