"""MME's room: its data and result files (benchmark.py, results.py) and the tools' rules and
aggregations (rules.py)."""
