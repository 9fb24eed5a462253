"""Real MLX ranks, the real daemon as a process, real servers; marked `ranks` by conftest."""
