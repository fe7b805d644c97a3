"""Plumbing of the server providers: the shared HTTP client and its error mapping, Ollama derived models."""
