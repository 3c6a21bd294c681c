"""GGUF's Q5_1, Q5_K, Q3_K, Q2_K, IQ4_NL and IQ4_XS blocks served as stored on the native kernels: random blocks (any
bytes are valid once the fp16 fields are finite) against llama.cpp's own dequantizer (gguf.quants), the weights
exactly (a table row's lookup) and every row's dot product with the kernels' int8-rounded activations, at row counts
that take each of the kernels' loops."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from support.int8_rounding import rounded_for
from test_quant_gguf import raw_tensor

from tally.layers.linear import linear_from_gguf
from tally.native import ops
from tally.quant.gguf_blocks import NATIVE_BLOCK_TYPES, concat_blocks, read_blocks
from tally.quant.native_linear import NativeInt4Linear, NativeTableLinear

pytestmark = pytest.mark.skipif(not ops.available(), reason="native kernels unavailable (see tally/native/library.py)")

# bytes a block, weights a block, byte offsets of its fp16 fields (d, and dmin / m where it has one)
LAYOUTS = {Q.Q5_1: (24, 32, (0, 2)), Q.Q5_K: (176, 256, (0, 2)), Q.Q3_K: (110, 256, (108,)),
           Q.Q2_K: (84, 256, (80, 82)), Q.IQ4_NL: (18, 32, (0,)), Q.IQ4_XS: (136, 256, (0,))}
KERNELS = {Q.Q5_1: (NativeInt4Linear, 5, 32), Q.Q5_K: (NativeInt4Linear, 5, 32), Q.Q3_K: (NativeInt4Linear, 4, 16),
           Q.Q2_K: (NativeInt4Linear, 4, 16), Q.IQ4_NL: (NativeTableLinear, ops.LUT4, 32),
           Q.IQ4_XS: (NativeTableLinear, ops.LUT4, 32)}


def random_blocks(ggml_type: Q, n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    size, per, halves = LAYOUTS[ggml_type]
    blocks = rng.integers(0, 256, (n, k // per, size), dtype=np.uint8)
    for at in halves:
        blocks[..., at:at + 2] = np.float16(0.002 + rng.random((n, k // per)) * 0.01)[..., None].view(np.uint8)
    return blocks.reshape(n, -1)


@pytest.mark.parametrize("ggml_type", list(LAYOUTS), ids=lambda t: t.name)
def test_blocks_are_served_natively_as_llama_cpp_dequantizes_them(ggml_type):
    n, k = 40, 512
    raw = raw_tensor(ggml_type, (n, k), random_blocks(ggml_type, n, k, seed=int(ggml_type)))
    assert ggml_type.name in NATIVE_BLOCK_TYPES  # no warning, not dequantized at load
    stored = torch.from_numpy(dequantize(raw.data, raw.ggml_type).reshape(n, k).astype(np.float32))
    layer = linear_from_gguf(raw, None, compute_dtype=torch.float32)
    kind, bits, group = KERNELS[ggml_type]
    assert isinstance(layer, kind) and getattr(layer, "bits", 8) == bits and layer.group_size == group
    ids = torch.tensor([0, 39, 7, 8])
    assert torch.equal(layer.embedding_rows(ids), stored[ids])
    for rows in (1, 4, 5, 9, 70):
        x = rounded_for(layer, torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)))
        ref = x.double() @ stored.double().T
        assert ((layer(x) - ref).abs().max() / ref.abs().max()).item() < 1e-5, rows
    # rows split in two and stacked again (a fused projection's parts) hold the same values
    halves = concat_blocks([read_blocks(raw_tensor(ggml_type, (n // 2, k), part)) for part in np.split(raw.data, 2)])
    assert torch.equal(halves.q, read_blocks(raw).q)


@pytest.mark.parametrize("ggml_type, served", [(Q.IQ4_XS, True), (Q.Q3_K, False), (Q.Q5_K, False)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_off_the_native_kernels_a_pytorch_layer_holds_them_or_the_loader_dequantizes(ggml_type, served):
    """bf16 compute: IQ4's table values (int8) suit PyTorch's group int8 layer; groups of 16 (Q3_K) and 5-bit values
    with minima (Q5_K) suit none of its layers (None: the loader dequantizes them)."""
    n, k = 16, 256
    raw = raw_tensor(ggml_type, (n, k), random_blocks(ggml_type, n, k, seed=3))
    layer = linear_from_gguf(raw, None, compute_dtype=torch.bfloat16)
    assert (layer is not None) == served
    if served:
        stored = torch.from_numpy(dequantize(raw.data, raw.ggml_type).reshape(n, k).astype(np.float32))
        x = torch.randn(3, k, generator=torch.Generator().manual_seed(0))
        ref = x @ stored.T
        assert ((layer(x.bfloat16()).float() - ref).abs().max() / ref.abs().max()).item() < 0.02
