"""HallusionBench's room: its data (benchmark.py) and its metrics (metrics.py)."""
