"""Quantized linear layers (int8, int4, W8A8, GGUF blocks), their RTN quantizers and SmoothQuant scales."""
