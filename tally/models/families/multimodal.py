"""The text model inside a multimodal checkpoint (Gemma 3 4B and up, Mistral Small 3.1, LLaVA-style wrappers): its
config is config.json's `text_config`, its tensors sit under the wrapper's prefix, and the vision tower and
projector are left unread. Tally serves such a model text only, as llama.cpp does without an mmproj file."""
from __future__ import annotations

from typing import Any

from tally.errors import ModelLoadError

# transformers 4.x and the files on the Hub nest the text model as `language_model.model.` (its head as
# `language_model.lm_head.`); transformers 5 loads them as `model.language_model.`
_TEXT_PREFIXES = (("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
                  ("model.language_model.", "model."))
_KEPT_AS_IS = ("lm_head.",)


def is_multimodal(cfg: dict[str, Any]) -> bool:
    """A wrapper around a text model: config.json nests the text model's config."""
    return isinstance(cfg.get("text_config"), dict)


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The wrapped text model's config.json, with transformers' defaults for what the file leaves out (the Hub's
    Gemma 3 files name only the fields that differ) and the architecture of the causal LM it is."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    outer = cfg.get("architectures") or [cfg.get("model_type", "?")]
    try:
        text = transformers.AutoConfig.for_model(**cfg).get_text_config().to_dict()
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"config.json of this {outer[0]} model does not read as transformers' config "
                             f"({type(exc).__name__}: {exc})") from exc
    architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(text.get("model_type", ""))
    if architecture is None:
        raise ModelLoadError(f"this {outer[0]} model's text part ({text.get('model_type')!r}) is not a causal LM "
                             "Tally reads")
    # the wrapper, not its text part, carries the file's dtype, whether the head is tied (transformers ties by the
    # outer config) and often the chat's end-of-turn ids
    inherited = {k: cfg[k] for k in ("torch_dtype", "dtype", "eos_token_id", "tie_word_embeddings")
                 if cfg.get(k) is not None}
    return text | inherited | {"architectures": [architecture]}


def text_tensor_name(stored: str) -> str | None:
    """A multimodal checkpoint's tensor name → the text model's (as a causal LM stores it), None for a tensor of
    the vision side."""
    for prefix, replacement in _TEXT_PREFIXES:
        if stored.startswith(prefix):
            return replacement + stored.removeprefix(prefix)
    return stored if stored.startswith(_KEPT_AS_IS) else None
