"""The package's version, in a module of its own: what reads it imports no other layer."""

__all__ = ["__version__"]

__version__ = "0.1.0.dev0"
