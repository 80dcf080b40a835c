"""Benchmarks. Each module prints a table and appends JSON records to bench/results/.

Run as `gobrrr bench NAME ...` or `python -m gobrrr.bench.MODULE ...`. Benchmarks report ratios
measured side by side in one run; tests, not benchmarks, assert correctness.
"""
