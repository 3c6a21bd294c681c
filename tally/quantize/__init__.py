"""`tally quantize`, the offline tool: calibration, activation capture, GPTQ / AWQ / SmoothQuant / RTN, mixed
precision, and the checkpoint writer (format: docs/quantization.md; read back by tally/models/packed_checkpoint.py)."""
