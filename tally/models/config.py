"""The shape of a model, parsed once from a Hugging Face config.json (or GGUF metadata by the
GGUF loader). Pure Python: the ledger plans from it without importing torch."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tally.errors import ModelLoadError

# HF `architectures[0]` → our family name. The family decides the small differences:
# qwen2 has a QKV bias, qwen3 normalises q and k per head, mistral may use a sliding window.
SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # one of SUPPORTED_ARCHITECTURES' values
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q, k, v projections (Qwen2)
    qk_norm: bool = False  # RMSNorm on q and k per head (Qwen3)
    sliding_window: int | None = None  # tokens each query may look back, itself included
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    torch_dtype: str = "float32"  # dtype the checkpoint was saved in

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_parameters(self) -> int:
        """Parameter count from the shape alone (what the ledger plans with)."""
        h, i, layers = self.hidden_size, self.intermediate_size, self.num_layers
        attn = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.qk_norm:
            attn += 2 * self.head_dim
        mlp = 3 * h * i
        norms = 2 * h
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return layers * (attn + mlp + norms) + embed + head + h

    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any]) -> "ModelConfig":
        archs = cfg.get("architectures") or []
        arch_name = archs[0] if archs else cfg.get("model_type", "?")
        family = SUPPORTED_ARCHITECTURES.get(arch_name)
        if family is None:
            raise ModelLoadError(
                f"unsupported architecture {arch_name!r}; Tally supports "
                + ", ".join(sorted(SUPPORTED_ARCHITECTURES))
            )
        num_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        head_dim = cfg.get("head_dim") or hidden // num_heads
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        window = cfg.get("sliding_window")
        if family == "qwen2" or family == "qwen3":
            # Qwen configs carry a sliding_window value but only use it when use_sliding_window.
            window = window if cfg.get("use_sliding_window") else None
        return cls(
            architecture=family,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
            rope_scaling=_rope_scaling(cfg),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", family == "qwen2")),
            qk_norm=family == "qwen3",
            sliding_window=int(window) if window else None,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
        )

    @classmethod
    def from_json_file(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ModelLoadError(f"no config.json at {path}") from exc
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_hf_dict(data)


def _rope_scaling(cfg: dict[str, Any]) -> dict[str, Any] | None:
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type")
    if kind in (None, "default"):
        return None
    return dict(scaling, rope_type=kind)
