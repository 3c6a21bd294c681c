"""Paged KV cache: block pool, prefix cache, per-request block tables."""
