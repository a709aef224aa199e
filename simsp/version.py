"""simsp's version (pyproject.toml's): `simsp --version`, every report's footer and every sweep
cache key. Its own module, so code below the package root's facade reads it without importing
the root (whose `simsp.sweep` imports simsp.api, which imports explore/)."""

__version__ = "0.1.0"
