"""Tiny Hugging Face checkpoints built on the fly (config.json + safetensors + tokenizer.json),
one per supported architecture, so every test has a real checkpoint without any download."""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedConfig

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# A little English and code so BPE learns real merges; multi-byte characters for UTF-8 tests.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 1000 3.14159",
    "Unicode: café naïve 日本語 中文 emoji 🙂🚀 ñandú Ωμέγα",
    "In a paged KV cache, blocks of tokens are shared between requests with a common prefix.",
    '{"name": "Tally", "version": 1, "tags": ["fast", "honest"]}',
]

ARCH_CONFIGS = {
    "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama", tie_word_embeddings=False),
    "llama_tied_mqa": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", tie_word_embeddings=True,
        num_key_value_heads=1,
    ),
    "qwen2": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", tie_word_embeddings=True),
    "mistral": dict(
        architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=12,
        tie_word_embeddings=False,
    ),
    "qwen3": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", tie_word_embeddings=True, head_dim=16,
    ),
}


def make_tokenizer(out_dir: Path, vocab_size: int = 400) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 256,
    }))


def make_checkpoint(out_dir: Path, arch: str = "llama", seed: int = 0, **overrides) -> Path:
    """Write a random fp32 checkpoint of `arch` (a key of ARCH_CONFIGS) to out_dir."""
    import transformers

    out_dir = Path(out_dir)
    make_tokenizer(out_dir)
    vocab_size = len(json.loads((out_dir / "tokenizer.json").read_text())["model"]["vocab"])
    cfg = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        bos_token_id=None,
        eos_token_id=2,  # <|im_end|>
        pad_token_id=0,
        torch_dtype="float32",
    )
    cfg.update(ARCH_CONFIGS[arch])
    cfg.update(overrides)
    config_cls = transformers.AutoConfig.for_model(cfg.pop("model_type")).__class__
    save_random_model(out_dir, config_cls(**cfg), seed)
    return out_dir


def auto_model_class(config: PreTrainedConfig) -> type:
    """transformers' Auto class that builds `config`'s model: the causal LM, or for a multimodal model (whose text
    part Tally serves) the image-text-to-text one."""
    import transformers

    if type(config) in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        return transformers.AutoModelForCausalLM
    return transformers.AutoModelForImageTextToText


def save_random_model(out_dir: Path, config: PreTrainedConfig, seed: int = 0,
                      draw_1d: Mapping[str, float] | None = None) -> None:
    """Random fp32 weights for the transformers `config`, saved with it as safetensors. Matrices are drawn with a
    larger std than transformers' init so logits are not all near-ties. So are the 1-D tensors whose names contain a
    key of `draw_1d`, around that key's value: norm weights, biases and attention sinks, which transformers starts
    at constants a reader that skips them would still match."""
    import transformers

    torch.manual_seed(seed)
    model = auto_model_class(config).from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            _draw(name, p, draw_1d)
    model.save_pretrained(out_dir, safe_serialization=True)


def save_random_model_by_layer(out_dir: Path, config: PreTrainedConfig, seed: int = 0,
                               draw_1d: Mapping[str, float] | None = None, dtype: torch.dtype = torch.bfloat16) -> None:
    """save_random_model's weights for a causal LM too large to hold at once: a one-layer model is saved (under the
    names save_pretrained gives, experts included), then each layer is drawn in the image of that layer and written
    as a shard of its own, so memory holds one layer; the tensors are stored as `dtype`."""
    import copy
    import tempfile

    from safetensors.torch import load_file, save_file

    one = copy.deepcopy(config)
    one.num_hidden_layers = 1
    if getattr(one, "layer_types", None):  # every layer's weights have layer 0's shapes
        one.layer_types = one.layer_types[:1]
    with tempfile.TemporaryDirectory() as tmp:
        save_random_model(Path(tmp), one, seed, draw_1d)
        saved = {k: v for f in sorted(Path(tmp).glob("*.safetensors")) for k, v in load_file(f).items()}
    layer0 = {name: t for name, t in saved.items() if ".layers.0." in name}
    shards = config.num_hidden_layers + 1
    weight_map: dict[str, str] = {}
    total_bytes = 0

    def write(n: int, tensors: dict[str, torch.Tensor]) -> None:
        nonlocal total_bytes
        shard = f"model-{n + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, Path(out_dir) / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
        total_bytes += sum(t.numel() * t.element_size() for t in tensors.values())

    write(0, {name: t.to(dtype) for name, t in saved.items() if name not in layer0})
    with torch.no_grad():
        for i in range(config.num_hidden_layers):
            write(i + 1, {name.replace(".layers.0.", f".layers.{i}."): _draw(name, t.clone(), draw_1d).to(dtype)
                          for name, t in layer0.items()})
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    (Path(out_dir) / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.save_pretrained(out_dir)


def _draw(name: str, p: torch.Tensor, draw_1d: Mapping[str, float] | None) -> torch.Tensor:
    """Redraw the parameter `name` in place as save_random_model does; returns it."""
    means = [mean for part, mean in (draw_1d or {}).items() if part in name]
    if p.dim() > 1:
        p.normal_(0.0, 0.15)
    elif means:
        p.normal_(means[0], 0.15)
    return p
