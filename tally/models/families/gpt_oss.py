"""GPT-OSS: alternating sliding and full layers with attention sinks and biases on every projection, YaRN, and
experts with biases routed by a softmax over the top k logits, through a clamped SwiGLU. The HF file stacks each
layer's experts in [experts, in, out] tensors with gate and up interleaved; they are cut apart at load."""
from __future__ import annotations

from typing import Any

from tally.models.config import Experts, ModelConfig
from tally.models.families import gguf_fields
from tally.models.families.family import Family, Relaid
from tally.models.families.hf_fields import shape_fields, windows

_NAMES = {"mlp.router.weight": "mlp.gate.weight", "mlp.router.bias": "mlp.gate.bias"}
# llama.cpp's names where they are not Llama's: GPT-OSS's norm before the MLP is written as a post-attention norm
GGUF_NAMES = {"attn_sinks.weight": "self_attn.sinks", "attn_output.bias": "self_attn.o_proj.bias",
              "post_attention_norm.weight": "post_attention_layernorm.weight", "ffn_gate_inp.bias": "mlp.gate.bias"}


_GATE_UP = (("gate", 0), ("up", 1))  # gate in the even columns, up in the odd ones


def _experts(stored: str, shape: tuple[int, ...]) -> list[Relaid]:
    """Each expert's projections and biases, as Tally's [out, in] weights, out of the stacked tensors: gate_up_proj
    [E, H, 2I], down_proj [E, I, H] and their biases [E, 2I], [E, H]."""
    kind, (count, *rest) = stored.removeprefix("mlp.experts."), shape
    if kind == "gate_up_proj" and len(rest) == 2:
        parts = [(f"{p}_proj.weight", (rest[1] // 2, rest[0]), lambda t, i=i: t[0, :, i::2].t()) for p, i in _GATE_UP]
    elif kind == "gate_up_proj_bias" and len(rest) == 1:
        parts = [(f"{p}_proj.bias", (rest[0] // 2,), lambda t, i=i: t[0, i::2]) for p, i in _GATE_UP]
    elif kind == "down_proj" and len(rest) == 2:
        parts = [("down_proj.weight", (rest[1], rest[0]), lambda t: t[0].t())]
    elif kind == "down_proj_bias" and len(rest) == 1:
        parts = [("down_proj.bias", (rest[0],), lambda t: t[0])]
    else:
        return []
    return [Relaid(f"mlp.experts.{e}.{name}", slice(e, e + 1), out, lambda t, take=take: take(t).contiguous())
            for e in range(count) for name, out, take in parts]


def _traits(limit: float, alpha: float, output_bias: bool) -> dict[str, Any]:
    return dict(attention_sinks=True, attention_output_bias=output_bias, activation="clamped_swiglu",
                swiglu_limit=limit, swiglu_alpha=alpha, norm_scale_in_float=True)


def _gpt_oss(cfg: dict[str, Any]) -> ModelConfig:
    fields = shape_fields(cfg, "gpt_oss")
    layers = fields["num_layers"]
    default_kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    fields |= windows({"layer_types": cfg.get("layer_types") or default_kinds}, layers, cfg.get("sliding_window"))
    bias = bool(cfg.get("attention_bias", True))
    experts = Experts(num_experts=int(cfg["num_local_experts"]), top_k=int(cfg["num_experts_per_tok"]),
                      intermediate_size=fields["intermediate_size"], normalize_top_k=False, routing="top_k_softmax",
                      bias=True)
    return ModelConfig(**fields | {"attention_bias": bias}, experts=experts,
                       **_traits(float(cfg.get("swiglu_limit", 7.0)), float(cfg.get("swiglu_alpha", 1.702)), bias))


def _gpt_oss_gguf(key: gguf_fields.GGUFKey, names: set[str]) -> dict[str, Any]:
    # llama.cpp fixes what the file does not say: layers 0, 2, 4, ... slide; SwiGLU clamped at 7 with alpha 1.702.
    # YaRN's correction range is not rounded out, as the released models' configs say (truncate: false; llama.cpp
    # rounds it).
    layers = int(key("block_count"))
    moe = gguf_fields.experts(key, normalize_top_k=False)["experts"]
    experts = Experts(moe.num_experts, moe.top_k, moe.intermediate_size, False, routing="top_k_softmax", bias=True)
    scaling = gguf_fields.yarn_scaling(key)
    yarn = {} if scaling is None else {"rope_scaling": scaling | {"truncate": False}}
    return dict(layer_types=tuple("sliding" if i % 2 == 0 else "full" for i in range(layers)), experts=experts,
                **yarn, **_traits(7.0, 1.702, "blk.0.attn_output.bias" in names))


GPT_OSS = Family("gpt_oss", ("GptOssForCausalLM",), ("gpt-oss",), _gpt_oss, _gpt_oss_gguf,
                 hf_rename=lambda name: _NAMES.get(name, name), hf_relaid=_experts, gguf_names=GGUF_NAMES)
