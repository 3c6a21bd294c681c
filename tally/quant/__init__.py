"""Runtime quantized formats and their layers (int8, int4, W8A8, GGUF blocks) and round-to-nearest at load.
Which layer serves a projection is decided in tally/layers/linear.py; the offline tool is tally/quantize."""
