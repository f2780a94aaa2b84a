"""The yes/no benchmarks pope-fast scores besides POPE, one module each, on the interface of `base`."""
