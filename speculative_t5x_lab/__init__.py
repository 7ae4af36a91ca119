"""Experiments around the library: benchmarks, step costs, reports, the result cache, peers."""
