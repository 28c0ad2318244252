"""Benchmark and analysis scripts, each run as `.venv/bin/python -m tools.NAME`."""
