"""Plumbing of the in-process providers: their base class, the model worker thread, batching, streaming."""
