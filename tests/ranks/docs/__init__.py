"""The docs keep their promises with real processes: the README's quick start, as written."""
