"""Exact speculative decoding for T5 1.1 encoder-decoders (JAX/Flax, T5X-compatible)."""
