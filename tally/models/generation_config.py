"""The request defaults a checkpoint ships in generation_config.json, applied as vLLM applies them (`--generation-config
auto`, its default; `--override-generation-config` on top): to every request that does not set them itself."""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from tally.errors import ConfigError
from tally.models.registry import packaged_generation_config

# vLLM's list: the generation_config.json keys that become SamplingParams defaults.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# vLLM reads it as the default max_tokens of requests that leave max_tokens unset
LENGTH_KEY = "max_new_tokens"
OVERRIDE_EXAMPLE = '\'{"max_new_tokens": 256, "temperature": 0.7}\''


def sampling_defaults(source: str, checkpoint_path: Path,
                      override: str | dict | None = None) -> dict[str, float]:
    """`source`: "auto" (the checkpoint's own file, if any; the built-in model's defaults), "vllm" (none: vLLM's
    defaults), or a folder; `override`: --override-generation-config, on top of either. `max_new_tokens` comes back
    as `max_tokens`, vLLM's name for it."""
    config = {} if source == "vllm" else _file_config(source, checkpoint_path)
    config = {**config, **generation_overrides(override)}
    defaults = {k: config[k] for k in SAMPLING_KEYS if _is_number(config.get(k))}
    if isinstance(config.get(LENGTH_KEY), int) and config[LENGTH_KEY] > 0:
        defaults["max_tokens"] = config[LENGTH_KEY]
    return defaults


def max_tokens_or_default(max_tokens: int | None, defaults: Mapping[str, float], room_tokens: int) -> int:
    """A request's max_tokens; unset, the generation config's max_new_tokens, never past the `room_tokens` the
    context leaves after the prompt (all of which, without a default)."""
    if max_tokens is not None:
        return max_tokens
    return min(int(defaults.get("max_tokens", room_tokens)), room_tokens)


def generation_overrides(value: str | dict | None) -> dict[str, float]:
    """--override-generation-config, checked: a JSON object of generation_config.json keys Tally applies."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ConfigError(f"override_generation_config is not JSON ({e}); e.g. {OVERRIDE_EXAMPLE}",
                              param="override_generation_config") from None
    if not isinstance(value, dict):
        raise ConfigError(f"override_generation_config must be a JSON object, e.g. {OVERRIDE_EXAMPLE}",
                          param="override_generation_config")
    known = (*SAMPLING_KEYS, LENGTH_KEY)
    for key, v in value.items():
        if key not in known:
            raise ConfigError(f"override_generation_config key {key!r} is not one Tally applies; known: "
                              f"{', '.join(known)}", param="override_generation_config")
        if key == LENGTH_KEY and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise ConfigError(f"override_generation_config {LENGTH_KEY} must be a whole number ≥ 1, got {v!r}",
                              param="override_generation_config")
        if not _is_number(v):
            raise ConfigError(f"override_generation_config {key} must be a number, got {v!r}",
                              param="override_generation_config")
    return value


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _file_config(source: str, checkpoint_path: Path) -> dict:
    folder = checkpoint_path if source == "auto" else Path(source)
    if source == "auto" and not folder.is_dir():  # a GGUF file: no generation_config.json beside its metadata
        return packaged_generation_config(checkpoint_path)
    path = folder / "generation_config.json"
    if not path.is_file():
        if source != "auto":
            raise ConfigError(f"--generation-config {source}: no generation_config.json there")
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise ConfigError(f"{path} is not JSON: {e}") from None
    return data if isinstance(data, dict) else {}
