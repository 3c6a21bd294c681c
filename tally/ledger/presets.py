"""Shapes of common models (their public config.json values) and specs of common accelerators,
so a team can plan before it downloads or buys anything."""
from __future__ import annotations

from dataclasses import dataclass

from tally.errors import ConfigError
from tally.models.config import ModelConfig
from tally.units import GiB

# name: (arch, layers, hidden, intermediate, heads, kv heads, head dim, vocab, tied, max positions)
_MODELS: dict[str, tuple] = {
    "Llama-2-7B": ("llama", 32, 4096, 11008, 32, 32, 128, 32000, False, 4096),
    "Llama-2-13B": ("llama", 40, 5120, 13824, 40, 40, 128, 32000, False, 4096),
    "Llama-2-70B": ("llama", 80, 8192, 28672, 64, 8, 128, 32000, False, 4096),
    "Llama-3.1-8B": ("llama", 32, 4096, 14336, 32, 8, 128, 128256, False, 131072),
    "Llama-3.1-70B": ("llama", 80, 8192, 28672, 64, 8, 128, 128256, False, 131072),
    "Llama-3.2-1B": ("llama", 16, 2048, 8192, 32, 8, 64, 128256, True, 131072),
    "Llama-3.2-3B": ("llama", 28, 3072, 8192, 24, 8, 128, 128256, True, 131072),
    "Mistral-7B": ("mistral", 32, 4096, 14336, 32, 8, 128, 32768, False, 32768),  # v0.3
    "Qwen2.5-0.5B": ("qwen2", 24, 896, 4864, 14, 2, 64, 151936, True, 32768),
    "Qwen2.5-1.5B": ("qwen2", 28, 1536, 8960, 12, 2, 128, 151936, True, 32768),
    "Qwen2.5-3B": ("qwen2", 36, 2048, 11008, 16, 2, 128, 151936, True, 32768),
    "Qwen2.5-7B": ("qwen2", 28, 3584, 18944, 28, 4, 128, 152064, False, 32768),
    "Qwen2.5-14B": ("qwen2", 48, 5120, 13824, 40, 8, 128, 152064, False, 32768),
    "Qwen2.5-32B": ("qwen2", 64, 5120, 27648, 40, 8, 128, 152064, False, 32768),
    "Qwen2.5-72B": ("qwen2", 80, 8192, 29568, 64, 8, 128, 152064, False, 32768),
    "SmolLM2-135M": ("llama", 30, 576, 1536, 9, 3, 64, 49152, True, 8192),
    "SmolLM2-360M": ("llama", 32, 960, 2560, 15, 5, 64, 49152, True, 8192),
    "SmolLM2-1.7B": ("llama", 24, 2048, 8192, 32, 32, 64, 49152, True, 8192),
}
_NAME_NOISE = ("-instruct", "-chat", "-hf", "-v0.3", "-it")


def _key(name: str) -> str:
    key = name.strip().lower().rsplit("/", 1)[-1]
    for noise in _NAME_NOISE:
        key = key.replace(noise, "")
    return key


def model_preset_names() -> list[str]:
    return list(_MODELS)


def find_model_preset(name: str) -> tuple[str, ModelConfig] | None:
    """('Llama-3.1-8B', config) for 'meta-llama/Llama-3.1-8B-Instruct' and the like; None if unknown."""
    wanted = _key(name)
    for preset, row in _MODELS.items():
        if _key(preset) == wanted:
            arch, layers, hidden, inter, heads, kv_heads, head_dim, vocab, tied, max_pos = row
            return preset, ModelConfig(
                architecture=arch, vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                max_position_embeddings=max_pos, tie_word_embeddings=tied,
                attention_bias=arch == "qwen2", torch_dtype="bfloat16",
            )
    return None


@dataclass(frozen=True)
class Device:
    name: str
    memory_bytes: int  # capacity per device
    bandwidth_bytes_per_s: float  # memory read bandwidth
    flops_per_s: float  # dense bf16/fp16 matmul peak (no sparsity)
    measured: bool = False  # probed on this machine rather than read from a datasheet


# Datasheet figures: nominal capacity (binary: drivers report a little less, which the runtime
# reserve covers), peak bandwidth, dense bf16 tensor FLOP/s without sparsity.
_DEVICES: dict[str, tuple[float, float, float]] = {
    "a10": (24, 600e9, 125e12),
    "l4": (24, 300e9, 121e12),
    "l40s": (48, 864e9, 362e12),
    "a100-40gb": (40, 1555e9, 312e12),
    "a100-80gb": (80, 2039e9, 312e12),
    "h100-80gb": (80, 3.35e12, 989e12),
    "h200-141gb": (141, 4.8e12, 989e12),
    "rtx-4090": (24, 1008e9, 165e12),
    "mi300x": (192, 5.3e12, 1307e12),
}
_DEVICE_ALIASES = {"a100": "a100-80gb", "h100": "h100-80gb", "h200": "h200-141gb", "4090": "rtx-4090",
                   "rtx4090": "rtx-4090", "a100-40": "a100-40gb", "a100-80": "a100-80gb",
                   "h100-80": "h100-80gb", "h200-141": "h200-141gb"}


def device_preset_names() -> list[str]:
    return list(_DEVICES)


def find_device(name: str) -> Device:
    key = name.strip().lower()
    key = _DEVICE_ALIASES.get(key, key)
    if key not in _DEVICES:
        raise ConfigError(f"unknown device {name!r}; choose one of {', '.join(_DEVICES)}, cpu, "
                          "or describe it with --memory 80GiB --bandwidth 3.35TB/s --flops 989T")
    memory_gib, bandwidth, flops = _DEVICES[key]
    return Device(key, int(memory_gib * GiB), bandwidth, flops)
