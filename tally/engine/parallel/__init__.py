"""Tensor and pipeline parallel execution: the process group and this rank's CPUs, the pipeline's stages, and the
loop a rank other than 0 runs."""
