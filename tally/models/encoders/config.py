"""Which checkpoints are encoders, and what Tally reads of their config.json: the BERT layout (absolute learned
positions, token types, post-LayerNorm, GELU) in its BERT and RoBERTa / XLM-RoBERTa spellings. Other encoders are
refused by name at load."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tally.errors import ModelLoadError

# model_type → whether position ids start after the padding id (RoBERTa's layout) rather than at 0 (BERT's)
_LAYOUTS = {"bert": False, "roberta": True, "xlm-roberta": True}
# encoders whose layout differs (rotary or relative positions, other blocks): refused, never read as BERT
_OTHER_ENCODERS = ("modernbert", "nomic_bert", "new", "jina_bert", "distilbert", "mpnet", "electra", "deberta",
                   "deberta-v2", "albert", "camembert", "xlm-roberta-xl", "roformer", "esm", "nomic-bert")
_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
SUPPORTED = "BertModel, RobertaModel, XLMRobertaModel and their *ForSequenceClassification (absolute positions)"


@dataclass(frozen=True)
class EncoderConfig:
    model_type: str
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int
    num_labels: int  # a *ForSequenceClassification's outputs; 0: an embedding model
    classifier_activation: str  # sigmoid | identity: what turns a cross-encoder's logit into its score

    @property
    def offset_positions(self) -> bool:
        """RoBERTa's positions count from pad_token_id + 1, over the non-padding tokens."""
        return _LAYOUTS[self.model_type]

    @property
    def max_tokens(self) -> int:
        """The longest input the position table holds."""
        return self.max_position_embeddings - (self.pad_token_id + 1 if self.offset_positions else 0)

    @property
    def is_cross_encoder(self) -> bool:
        return self.num_labels > 0


def read_encoder_config(path: Path) -> EncoderConfig | None:
    """The encoder config of the HF folder `path`; None for a checkpoint that is not an encoder (a decoder, a GGUF
    file); ModelLoadError, naming what Tally reads, for an encoder whose layout Tally does not run."""
    if not (path.is_dir() and (path / "config.json").is_file()):
        return None
    raw = json.loads((path / "config.json").read_text())
    kind = str(raw.get("model_type", "")).lower()
    architecture = (raw.get("architectures") or [""])[0]
    if kind in _OTHER_ENCODERS or architecture.startswith(("ModernBert", "NomicBert", "NewModel", "DistilBert")):
        raise ModelLoadError(f"{path}: {architecture or kind} is an encoder Tally does not run; it runs {SUPPORTED}")
    if kind not in _LAYOUTS:
        return None
    problems = []
    if raw.get("position_embedding_type", "absolute") != "absolute":
        problems.append(f"position_embedding_type {raw['position_embedding_type']!r} (Tally reads absolute)")
    if raw.get("hidden_act", "gelu") not in _ACTIVATIONS:
        problems.append(f"hidden_act {raw['hidden_act']!r} (Tally reads {', '.join(_ACTIVATIONS)})")
    if raw.get("is_decoder") or raw.get("add_cross_attention"):
        problems.append("is_decoder / add_cross_attention (Tally reads bidirectional encoders)")
    classify = architecture.endswith("ForSequenceClassification")
    if not classify and architecture and not architecture.endswith(("Model", "ForMaskedLM", "ForPreTraining")):
        problems.append(f"architecture {architecture} (Tally reads the encoder of {SUPPORTED})")
    if problems:
        raise ModelLoadError(f"{path}: this {kind} checkpoint has {'; '.join(problems)}")
    labels = len(raw.get("id2label") or {}) or int(raw.get("num_labels", 2))
    return EncoderConfig(
        model_type=kind, architecture=architecture, vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"],
        num_layers=raw["num_hidden_layers"], num_heads=raw["num_attention_heads"],
        intermediate_size=raw["intermediate_size"], hidden_act=raw.get("hidden_act", "gelu"),
        max_position_embeddings=raw["max_position_embeddings"], type_vocab_size=raw.get("type_vocab_size", 2),
        layer_norm_eps=raw.get("layer_norm_eps", 1e-12), pad_token_id=raw.get("pad_token_id") or 0,
        num_labels=labels if classify else 0, classifier_activation=_classifier_activation(path, raw, labels))


def _classifier_activation(path: Path, raw: dict, num_labels: int) -> str:
    """sentence-transformers' CrossEncoder rule (and vLLM's): the activation its config names (in
    config_sentence_transformers.json, or config.json as older versions wrote it), else a sigmoid over one logit."""
    st_file = path / "config_sentence_transformers.json"
    st_config = json.loads(st_file.read_text()) if st_file.is_file() else {}
    named = str(st_config.get("activation_fn") or (raw.get("sentence_transformers") or {}).get("activation_fn")
                or raw.get("sbert_ce_default_activation_function") or "")
    if named:
        if named.endswith("Sigmoid"):
            return "sigmoid"
        if named.endswith("Identity"):
            return "identity"
        raise ModelLoadError(f"config.json's sentence_transformers.activation_fn {named!r} is not one Tally applies; "
                             "it applies torch.nn.Sigmoid or torch.nn.Identity")
    return "sigmoid" if num_labels == 1 else "identity"
