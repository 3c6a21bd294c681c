"""Encoder models (BERT, RoBERTa, XLM-RoBERTa) for embeddings and cross-encoder scores: bidirectional attention over a
packed batch, no KV cache, served by tally/engine/encoder_engine.py."""
