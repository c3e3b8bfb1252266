"""Benchmarks: the load client, the reference models, the stages and ratios of `make bench`, the soak."""
