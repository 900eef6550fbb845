"""Benchmark harness: python benchmarks/run.py --help."""
