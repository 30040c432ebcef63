"""Benchmarks of the kit's reference DDP (scripts, not tests; see ``bench_throughput.py``)."""
