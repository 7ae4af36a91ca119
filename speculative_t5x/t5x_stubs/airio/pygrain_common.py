"""Import stub: t5x/utils_test.py imports this module; nothing in it is used."""
