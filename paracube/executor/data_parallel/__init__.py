"""Data parallelism: gradient buckets, their reduction (overlapped or not), and the optimizers (zero stages)."""
