"""Yes/no hallucination benchmarks beside POPE: each one a module declaring its data, its tools' rules and
their result files (`base.Benchmark`)."""
