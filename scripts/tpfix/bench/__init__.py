"""Benchmarks: each prints its figures side by side with the upstream path."""
