"""Across real hosts built from network namespaces (root); marked `ranks` by conftest."""
