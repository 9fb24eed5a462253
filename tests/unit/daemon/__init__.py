"""The daemon: settings, judgement, the ladder, journals, directories."""
