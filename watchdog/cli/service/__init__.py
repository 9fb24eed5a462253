"""The service: `service print/install/uninstall`, its launchd and systemd files
(`unit`), and `launchctl`/`systemctl` driven (`control`)."""
