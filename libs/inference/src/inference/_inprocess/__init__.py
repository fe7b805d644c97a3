"""Plumbing of the in-process providers: the model worker thread, request batching, token streaming."""
