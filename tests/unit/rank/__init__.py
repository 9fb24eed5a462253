"""The rank side: the hook, its hot paths, its launch environment."""
