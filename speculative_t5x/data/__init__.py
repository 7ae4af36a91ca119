"""The data layer: offline corpora, seqio tasks and vocabularies."""
