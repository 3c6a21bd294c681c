"""The CPU int4 kernel's packed weight layout, and how to read it back without keeping a second copy.

`torch._convert_weight_to_int4pack_for_cpu` packs rows in blocks of BLOCK_N (64 with AVX-512, 32 with AVX2):
for every k, the block's BLOCK_N/2 bytes hold rows 0..BLOCK_N/2-1 in the low nibbles and the other half in the
high nibbles (aten/src/ATen/native/cpu/int4mm_kernel.cpp). Reading it back lets the many-token path dequantize
from the kernel's own bytes. The layout is an implementation detail of the build, so it is probed once per
process; where the probe does not recognise it, layers fall back to the kernel for every batch size.
"""
from __future__ import annotations

import functools

import torch

_KERNEL_ALIGN_N = 16  # the packer rejects N that is not a multiple of 16


@functools.cache
def kernel_block_n() -> int | None:
    """BLOCK_N of this build's packed layout, or None if it is not the blocked-nibble layout we can read."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (128, 64), dtype=torch.int32, generator=gen)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    for block_n in (64, 32):
        if torch.equal(unpack_transposed(packed, 128, block_n, torch.int32).reshape(64, 128), q.t()):
            return block_n
    return None


def padded_out_features(out_features: int) -> int:
    """Rows after padding so that every block is full (the only layout `unpack_transposed` reads)."""
    align = kernel_block_n() or _KERNEL_ALIGN_N
    return -(-out_features // align) * align


def pack(q: torch.Tensor) -> torch.Tensor:
    """q uint8 [N, K] in 0..15 (N already padded) -> the kernel's packed uint8 [N, K/2]."""
    return torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)


def unpack_transposed(packed: torch.Tensor, n_rows: int, block_n: int, dtype: torch.dtype) -> torch.Tensor:
    """Packed [N, K/2] -> q as a fresh contiguous [K, N/block_n, block_n] in `dtype`: W^T in row order.
    Each nibble half is converted straight into its place (a uint8 intermediate fed to a float op would be
    promoted through a slow strided copy)."""
    k = packed.numel() * 2 // n_rows
    blocks = packed.view(n_rows // block_n, k, block_n // 2)
    out = torch.empty(k, n_rows // block_n, block_n, dtype=dtype, device=packed.device)
    out[..., :block_n // 2].copy_((blocks & 15).transpose(0, 1))
    out[..., block_n // 2:].copy_((blocks >> 4).transpose(0, 1))
    return out
