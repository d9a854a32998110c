"""Side-by-side benchmarks against the tools users would pick instead (`make bench`)."""
