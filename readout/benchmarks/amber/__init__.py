"""AMBER's room (its discriminative part): its data (benchmark.py) and its metrics (metrics.py)."""
