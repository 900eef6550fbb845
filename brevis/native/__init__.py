"""Compiled kernels (C, built by `pip install`); each has a Python
equivalent in the module that uses it, so an unbuilt tree still works."""
