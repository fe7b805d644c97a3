"""Machinery of the provider contract: request validation, the adapter lifecycle, optional imports, paths."""
