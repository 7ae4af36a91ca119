"""Import stub for airio (not on PyPI): the names T5X imports, for its isinstance checks."""
