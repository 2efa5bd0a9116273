"""The package version, in a module of its own so that any layer can read it without importing the rest."""
__version__ = "0.1.0"
