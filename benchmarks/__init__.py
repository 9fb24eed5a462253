"""The benchmarks behind docs/performance.md: run each from the repository root as
`python -m benchmarks.NAME` (they import the test helpers from `tests.support`)."""
