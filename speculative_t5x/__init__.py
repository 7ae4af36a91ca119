"""Exact speculative decoding for T5X's models, T5 1.1 encoder-decoders and decoder-only
(prefix) language models, in JAX/Flax: a drop-in for T5X's decoding."""
