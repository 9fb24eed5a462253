"""The launcher (watchdog/launch/): its decision, its fitness gate, its journal."""
