"""The daemon's metrics scraped by a real Prometheus."""
