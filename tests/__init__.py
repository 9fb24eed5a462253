"""The test suite, by level, then by the package tested.

`unit/` is the fast layer (`pytest -m "not ranks"`); `ranks/` runs real MLX ranks, the
real daemon and real servers; `multihost/` builds hosts from network namespaces;
`support/` holds the helpers, which the benchmarks import too.
"""
