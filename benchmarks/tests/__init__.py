"""Tests of the benchmarks' own logic (the autoscaling reference and verdicts, the simulator's
validation cases and arithmetic, bench_tune's comparison), kept beside the benchmarks: no file
under tests/ imports `benchmarks` (tests/unit/test_rooms.py holds that)."""
