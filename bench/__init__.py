"""Benchmark drivers: workload recording (record.py), the in-guest swap benchmark (swapbench.py),
host store-core throughput (hostbench.py) and the report (``python -m bench``)."""
