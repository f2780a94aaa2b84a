"""Benchmarks: pope-fast against the paper's transformers pipeline (`throughput`) and the kernels
against their baselines (`kernels`). The built-in checkpoints and data they run on live in
`pope_fast.engine.synthetic`, shared with the demo and the tests."""
from .throughput import SEED_FAMILIES, BenchConfig, format_report, run_bench

__all__ = ["SEED_FAMILIES", "BenchConfig", "format_report", "run_bench"]
