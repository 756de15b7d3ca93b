"""Benchmarks: NVIDIA-style training and inference throughput / latency."""
