"""Import stub for jestimator (PyPI's 0.3.3 fails to import with jax 0.10)."""
