"""Benchmarks: ``python -m benchmarks.<name>``."""
