"""The package version, where every layer can read it without importing the package root."""

__version__ = "0.1.0"
