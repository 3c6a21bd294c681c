"""The sampling defaults a checkpoint ships in generation_config.json, applied as vLLM applies them
(`--generation-config auto`, its default): to every request that does not set them itself."""
from __future__ import annotations

import json
from pathlib import Path

from tally.errors import ConfigError

# vLLM's list: the generation_config.json keys that become SamplingParams defaults.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_defaults(source: str, checkpoint_path: Path) -> dict[str, float]:
    """`source`: "auto" (the checkpoint's own file, if any), "vllm" (none: vLLM's defaults), or a folder."""
    if source == "vllm":
        return {}
    folder = checkpoint_path if source == "auto" else Path(source)
    if source == "auto" and not folder.is_dir():  # a GGUF file: no generation_config.json beside its metadata
        return {}
    path = folder / "generation_config.json"
    if not path.is_file():
        if source != "auto":
            raise ConfigError(f"--generation-config {source}: no generation_config.json there")
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise ConfigError(f"{path} is not JSON: {e}") from None
    return {k: data[k] for k in SAMPLING_KEYS if isinstance(data.get(k), (int, float))}
