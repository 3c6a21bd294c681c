"""What every family reads the same way from a Hugging Face config.json: the shape, the rotary settings (old
`rope_theta` + `rope_scaling` and transformers 5's `rope_parameters`), the special tokens."""
from __future__ import annotations

from typing import Any

from tally.errors import ModelLoadError

ROPE_SCALINGS = ("linear", "llama3", "longrope", "yarn")


def require(cfg: dict[str, Any], key: str, family: str) -> Any:
    if cfg.get(key) is None:
        raise ModelLoadError(f"config.json of this {family} model lacks {key!r}; the file is incomplete")
    return cfg[key]


def shape_fields(cfg: dict[str, Any], family: str) -> dict[str, Any]:
    """ModelConfig's fields common to every family."""
    heads = int(require(cfg, "num_attention_heads", family))
    hidden = int(require(cfg, "hidden_size", family))
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    theta, scaling = rope_settings(cfg, family)
    return dict(
        architecture=family,
        vocab_size=int(require(cfg, "vocab_size", family)),
        hidden_size=hidden,
        intermediate_size=int(require(cfg, "intermediate_size", family)),
        num_layers=int(require(cfg, "num_hidden_layers", family)),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
    )


def rope_settings(cfg: dict[str, Any], family: str, layer_type: str = "full_attention") -> tuple[float, dict | None]:
    """(base, scaling or None) of the layers of `layer_type`; transformers 5 may nest them per layer type."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and layer_type in params:
        params = params[layer_type]
    params = params if isinstance(params, dict) else {}
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    scaling = cfg.get("rope_scaling") or params
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind in (None, "default"):
        return theta, None
    if kind not in ROPE_SCALINGS:
        raise ModelLoadError(f"this {family} model's rope scaling {kind!r} (config.json rope_scaling) is not "
                             f"supported; Tally supports {', '.join(ROPE_SCALINGS)}")
    scaling = {k: v for k, v in scaling.items() if k not in ("rope_theta", "type")}
    if kind in ("longrope", "yarn"):  # the original context may sit beside the scaling; their ratio is the factor
        original = (scaling.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
                    or cfg.get("max_position_embeddings"))
        scaling["original_max_position_embeddings"] = int(original)
        if not scaling.get("factor"):
            scaling["factor"] = int(cfg.get("max_position_embeddings", original)) / int(original)
    return theta, dict(scaling, rope_type=kind)


def activation(cfg: dict[str, Any], family: str) -> str:
    """The gated MLP's activation, by transformers' names."""
    name = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    kinds = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
    if name not in kinds:
        raise ModelLoadError(f"this {family} model's activation {name!r} (config.json hidden_act) is not "
                             f"supported; Tally supports {', '.join(kinds)}")
    return kinds[name]


def windows(cfg: dict[str, Any], num_layers: int, window: int | None) -> dict[str, Any]:
    """ModelConfig's `layer_types` and `sliding_window` from transformers' `layer_types` (per layer
    "sliding_attention" or "full_attention") and the window: per layer only where layers differ."""
    kinds = tuple("sliding" if t == "sliding_attention" else "full" for t in cfg.get("layer_types") or ())
    unknown = sorted(set(cfg.get("layer_types") or ()) - {"sliding_attention", "full_attention"})
    if unknown:
        raise ModelLoadError(f"config.json's layer_types has {', '.join(map(repr, unknown))}; Tally supports "
                             "'sliding_attention' and 'full_attention'")
    if kinds and len(kinds) != num_layers:
        raise ModelLoadError(f"config.json's layer_types lists {len(kinds)} layers but num_hidden_layers is "
                             f"{num_layers}")
    if not window or (kinds and "sliding" not in kinds):
        return {"layer_types": (), "sliding_window": None}
    return {"layer_types": kinds if "full" in kinds else (), "sliding_window": int(window)}
