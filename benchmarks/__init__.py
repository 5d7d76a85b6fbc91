"""Benchmarks of servepilot itself (run by make targets; not part of the package)."""
