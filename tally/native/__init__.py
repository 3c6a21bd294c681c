"""CPU kernels in C (AVX2), built on first use: see library.py."""
