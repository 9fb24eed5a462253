"""The network face: HTTP, metrics, the cluster view, fences, sd_notify."""
