"""dirmq's benchmarks, run by hand from the project root as `python -m bench.<name>` (never
collected by pytest). Each one is built on `bench.harness`; docs/benchmarks.md says what each
measures and holds the results."""
