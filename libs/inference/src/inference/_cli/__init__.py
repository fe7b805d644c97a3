"""Subcommands of the ``inference`` command line that live outside :mod:`inference.cli` (one module each)."""
