"""The yes/no benchmarks besides POPE, one module each, every one a `base.Benchmark`."""
