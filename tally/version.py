"""Tally's version: the one source (pyproject.toml reads it, /version and `tally.__version__` report it)."""
__version__ = "0.1.0"
