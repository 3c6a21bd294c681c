"""GPTQ and AWQ checkpoints in Hugging Face's layout (tally/models/hf_quantized.py) serve their stored weights.

The packers here follow the formats as AutoGPTQ and AutoAWQ write them, bit by bit, independently of the reader:
a checkpoint packed here must compute what a dense checkpoint of its dequantized weights computes.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tally import LLM, SamplingParams
from tally.errors import ModelLoadError
from tally.ledger.model_source import resolve_model
from tally.models.prefill import prefill
from tally.quant.base import QuantLinear

PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
GROUP = 32


def words(nibbles: torch.Tensor) -> torch.Tensor:
    """[..., 8] values 0..15 -> int32 [...]: nibble j in bits 4j (two's complement, as the files hold them)."""
    w = sum(nibbles[..., j].long() << (4 * j) for j in range(8))
    return torch.where(w >= 1 << 31, w - (1 << 32), w).to(torch.int32).contiguous()


def quantize(w: torch.Tensor, g_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit per group of inputs (g_idx [K]): q [N, K], zero and scale [G, N]; zeros in 1..15."""
    groups = int(g_idx.max()) + 1
    lo = torch.stack([w[:, g_idx == g].amin(1) for g in range(groups)])
    hi = torch.stack([w[:, g_idx == g].amax(1) for g in range(groups)])
    scale = ((hi - lo) / 15).half().float()
    zero = (-lo / scale).round().clamp(1, 15)
    q = (w / scale[g_idx].t() + zero[g_idx].t()).round().clamp(0, 15)
    return q.to(torch.uint8), zero.to(torch.uint8), scale


def pack(method: str, q: torch.Tensor, zero: torch.Tensor, scale: torch.Tensor, g_idx: torch.Tensor,
         v2: bool) -> dict[str, torch.Tensor]:
    n, k = q.shape
    q_kn = q.t()
    if method == "gptq":
        stored_zero = zero if v2 else zero - 1  # AutoGPTQ's historical offset
        return {"qweight": words(q_kn.reshape(k // 8, 8, n).permute(0, 2, 1)),
                "qzeros": words(stored_zero.reshape(-1, n // 8, 8)),
                "scales": scale.half(), "g_idx": g_idx.to(torch.int32)}
    order = list(AWQ_ORDER)
    return {"qweight": words(q_kn.reshape(k, n // 8, 8)[..., order]),
            "qzeros": words(zero.reshape(-1, n // 8, 8)[..., order]), "scales": scale.half()}


def write_pair(src: Path, tmp: Path, method: str, act_order: bool = False, v2: bool = False) -> tuple[Path, Path]:
    """(quantized checkpoint, dense checkpoint of the same dequantized weights)."""
    quant_dir, dense_dir = tmp / method, tmp / f"{method}-dense"
    for d in (quant_dir, dense_dir):
        shutil.copytree(src, d)
    tensors = load_file(str(src / "model.safetensors"))
    quantized, dense = {}, {}
    gen = torch.Generator().manual_seed(0)
    for name, t in tensors.items():
        base = name.removesuffix(".weight")
        if not any(base.endswith(p) for p in PROJECTIONS):
            quantized[name] = dense[name] = t
            continue
        k = t.shape[1]
        g_idx = torch.arange(k) // GROUP
        if act_order:
            g_idx = g_idx[torch.randperm(k, generator=gen)]
        q, zero, scale = quantize(t, g_idx)
        dense[name] = (scale[g_idx].t() * (q.float() - zero[g_idx].t().float())).contiguous()
        quantized |= {f"{base}.{s}": v for s, v in pack(method, q, zero, scale, g_idx, v2).items()}
    save_file(quantized, str(quant_dir / "model.safetensors"))
    save_file(dense, str(dense_dir / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    block = {"quant_method": method, "bits": 4, "group_size": GROUP}
    block |= ({"desc_act": act_order, "sym": False, "checkpoint_format": "gptq_v2" if v2 else "gptq"}
              if method == "gptq" else {"zero_point": True, "version": "gemm"})
    (quant_dir / "config.json").write_text(json.dumps(config | {"quantization_config": block}))
    return quant_dir, dense_dir


def assert_same_model(quant_dir: Path, dense_dir: Path) -> LLM:
    quant = LLM(str(quant_dir), dtype="float32", kv_cache_memory=2_000_000)
    dense = LLM(str(dense_dir), dtype="float32", kv_cache_memory=2_000_000)
    ids = dense.get_tokenizer().encode("The quick brown fox jumps over the lazy dog.")
    want = dense.engine.model.compute_logits(prefill(dense.engine.model, ids))
    got = quant.engine.model.compute_logits(prefill(quant.engine.model, ids))
    assert (got - want).abs().max().item() < 1e-4
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = ["Paris is the capital of", "def add(a, b):"]
    assert ([o.outputs[0].token_ids for o in quant.generate(prompts, params)]
            == [o.outputs[0].token_ids for o in dense.generate(prompts, params)])
    return quant


@pytest.mark.parametrize("arch, method, v2", [("llama", "gptq", False), ("qwen2", "gptq", True),
                                              ("llama", "awq", False), ("qwen2", "awq", False)])
def test_hf_layout_checkpoint_serves_its_stored_int4_weights(tiny_model_factory, tmp_path, torch_kernels,
                                                             arch, method, v2):
    quant_dir, dense_dir = write_pair(tiny_model_factory(arch), tmp_path, method, v2=v2)
    quant = assert_same_model(quant_dir, dense_dir)
    layer = quant.engine.model.layers[0].qkv_proj
    assert layer.scheme == "int4" and layer.group_size == GROUP  # int4 layers, not dequantized weights
    held = {t.name: t for t in resolve_model(str(quant_dir)).tensors}["layers.0.q_proj"]  # `tally plan` prices it
    assert held.numel // 2 < held.stored_bytes < held.numel  # packed nibbles plus group scales and zeros


def test_gptq_act_order_is_served_dense_and_exact(tiny_llama, tmp_path, torch_kernels):
    quant_dir, dense_dir = write_pair(tiny_llama, tmp_path, "gptq", act_order=True)
    quant = assert_same_model(quant_dir, dense_dir)
    assert not isinstance(quant.engine.model.layers[0].qkv_proj, QuantLinear)
    assert all(t.stored_bytes is None for t in resolve_model(str(quant_dir)).tensors)  # `tally plan`: dense too


def test_hf_layout_checkpoint_on_native_kernels(tiny_llama, tmp_path):
    """With the native kernels the stored integers sit in native int4 layers; their logits differ from the dense
    dequantized model only by the int8 rounding of activations."""
    from tally.native import ops
    from tally.quant.native_linear import NativeInt4Linear

    if not ops.available():
        pytest.skip("native kernels unavailable")
    quant_dir, dense_dir = write_pair(tiny_llama, tmp_path, "awq")
    quant = LLM(str(quant_dir), dtype="float32", kv_cache_memory=2_000_000).engine.model
    dense = LLM(str(dense_dir), dtype="float32", kv_cache_memory=2_000_000).engine.model
    assert isinstance(quant.layers[0].qkv_proj, NativeInt4Linear)
    ids = list(range(3, 40))
    want, got = dense.compute_logits(prefill(dense, ids)), quant.compute_logits(prefill(quant, ids))
    assert ((got - want).norm() / want.norm()).item() < 0.05


@pytest.mark.parametrize("change, message", [
    ({"bits": 8}, "bits=8"), ({"version": "gemv"}, "GEMM layout"), ({"group_size": 64}, "stores it as"),
])
def test_unreadable_hf_layout_checkpoints_say_why(tiny_llama, tmp_path, change, message):
    quant_dir, _ = write_pair(tiny_llama, tmp_path, "awq")
    config = json.loads((quant_dir / "config.json").read_text())
    config["quantization_config"] |= change
    (quant_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=message):
        LLM(str(quant_dir), dtype="float32", kv_cache_memory=2_000_000)
