"""Integrations with other tools (each module imports its tool; ``import inference`` imports none of them)."""
