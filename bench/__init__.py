"""Benchmarks: pope-fast against the paper's transformers pipeline (`throughput`) and the kernels
against their baselines (`kernels`). The built-in checkpoints they run on are the families' own
random ones (engine/synthetic/), on synthetic data from `pope_fast.engine.synthetic`."""
from .report import format_report
from .throughput import BenchConfig, run_bench

__all__ = ["BenchConfig", "format_report", "run_bench"]
