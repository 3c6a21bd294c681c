"""Quantized linear layers (int8, int4, W8A8, GGUF blocks), their RTN quantizers and SmoothQuant scales; calibrated
quantization (GPTQ, AWQ, mixed precision) and the checkpoint `tally quantize` writes (docs/quantization.md)."""
