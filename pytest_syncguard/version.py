"""This release's version: what a results document and a baseline's fingerprint record. No imports."""

__version__ = "0.1.0"
