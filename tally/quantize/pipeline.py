"""`tally quantize` end to end: checkpoint → calibration statistics → layer by layer quantization → mixed
precision choice → a checkpoint directory Tally (`LLM(dir)`) loads back."""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tally.errors import ConfigError
from tally.models.builder import build_model, model_attention
from tally.models.config import ModelConfig
from tally.models.families import family, hf_config
from tally.models.decoder import CausalLM
from tally.models.loader import Checkpoint, load_checkpoint
from tally.models.tokenizer import load_tokenizer
from tally.progress import Track, untracked
from tally.quantize.calibrate import CalibrationSet, load_calibration
from tally.quantize.capture import capture
from tally.quantize.layer import (
    SITE_PROJECTIONS,
    LayerQuant,
    QuantizeOptions,
    quantize_layer,
)
from tally.quantize.mixed import layer_sensitivity, most_sensitive, parse_keep
from tally.quantize.writer import write_packed

if TYPE_CHECKING:
    from tally.models.tokenizer import Tokenizer

SENSITIVITY_SAMPLES = 8  # forwards per layer for --auto-mixed: enough to rank layers, cheap enough to run L times
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                    "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model")


@dataclass(frozen=True)
class QuantizeJob:
    model: str | None
    out: Path
    options: QuantizeOptions
    calib: Path | None = None
    samples: int = 256
    max_tokens: int = 512
    keep_high_precision: str | None = None
    auto_mixed: int = 0
    deployment_system_prompt: str | None = None


@dataclass
class QuantizeResult:
    out: Path
    warnings: list[str]
    dense_layers: list[int]
    sensitivity: dict[int, float] = field(default_factory=dict)
    layers: list[LayerQuant] = field(default_factory=list)  # the quantized layers, in memory


def run(job: QuantizeJob, log: Callable[[str], None] = lambda _: None, track: Track = untracked) -> QuantizeResult:
    ckpt = load_checkpoint(job.model)
    if ckpt.quantization:
        raise ConfigError(f"{ckpt.path} is already quantized ({ckpt.quantization}); quantize the original checkpoint")
    cfg = ckpt.config
    if cfg.experts is not None:
        raise ConfigError(f"tally quantize does not quantize mixture-of-experts models ({cfg.architecture}) yet; "
                          "serve it with --quantization int8 or int4 to quantize on the fly")
    if cfg.norm_layout != "pre" and job.options.method in ("awq", "smoothquant"):
        raise ConfigError(f"--method {job.options.method} folds its scales into the norm before each projection, "
                          f"which {cfg.architecture} does not have; use --method gptq or rtn", param="method")
    hf_config_json = _hf_config(ckpt)
    tokenizer = load_tokenizer(ckpt)
    keep = parse_keep(job.keep_high_precision, cfg.num_layers)
    if not 0 <= job.auto_mixed <= cfg.num_layers:
        raise ConfigError(f"--auto-mixed {job.auto_mixed} must be between 0 and the model's {cfg.num_layers} layers")
    calib = None
    if job.options.needs_calibration or job.auto_mixed:
        if job.calib is None:
            raise ConfigError(f"--method {job.options.method} and --auto-mixed need --calib FILE.jsonl (prompts the "
                              "deployment serves); or use --method rtn", param="calib")
        calib = load_calibration(job.calib, tokenizer, max_samples=job.samples, max_tokens=job.max_tokens,
                                 deployment_system_prompt=job.deployment_system_prompt)
        for w in calib.warnings:
            log(f"warning: {w}")
    original = dict(ckpt.tensors(track))
    weights = {n: t.float() for n, t in original.items()}
    model = fp_model(cfg, weights, job.max_tokens) if calib else None
    stats = capture(model, track(calib.token_ids, "calibration forwards"),
                    hessian=job.options.method == "gptq") if calib else None
    todo = [i for i in range(cfg.num_layers) if i not in keep or job.auto_mixed]
    layers = [quantize_layer(i, weights, cfg, stats, job.options)
              for i in track(todo, f"layers quantized ({job.options.method}, {job.options.scheme.label()})")]
    sensitivity = {}
    if job.auto_mixed:
        sensitivity = layer_sensitivity(model, cfg, calib.token_ids[:SENSITIVITY_SAMPLES],
                                        track(layers, "layer sensitivity"))
        keep = keep | most_sensitive(sensitivity, job.auto_mixed)
    layers = [layer for layer in layers if layer.index not in keep]
    _write(job, ckpt, hf_config_json, tokenizer, original, layers, sorted(keep), calib)
    return QuantizeResult(job.out, calib.warnings if calib else [], sorted(keep), sensitivity, layers)


def fp_model(cfg: ModelConfig, weights: dict[str, torch.Tensor], max_tokens: int) -> CausalLM:
    """The full-precision (fp32, dense) model over `weights` (not consumed)."""
    attn = model_attention("reference", cfg)
    return build_model(cfg, dict(weights), dtype=torch.float32, quantization=None, attn=attn,
                       max_model_len=min(cfg.max_position_embeddings, max_tokens))


def _write(job: QuantizeJob, ckpt: Checkpoint, hf_config_json: dict[str, Any], tokenizer: Tokenizer,
           original: dict[str, torch.Tensor], layers: list[LayerQuant], dense_layers: list[int],
           calib: CalibrationSet | None) -> None:
    tensors = dict(original)
    for layer in layers:
        for names in SITE_PROJECTIONS.values():
            for n in names:
                del tensors[f"model.layers.{layer.index}.{n}.weight"]
        tensors |= {name: t.to(original[name].dtype) if name in original else t for name, t in layer.stored.items()}
    opts = job.options
    block = {"scheme": opts.scheme.name, "bits": opts.scheme.bits, "group_size": opts.scheme.group_size,
             "method": opts.method, "act_order": opts.act_order, "dense_layers": dense_layers,
             "calibration_samples": len(calib.token_ids) if calib else 0}
    if opts.method == "smoothquant":
        block["smoothquant_alpha"] = opts.alpha
    job.out.mkdir(parents=True, exist_ok=True)
    _write_tokenizer(ckpt, tokenizer, job.out)
    write_packed(job.out, hf_config_json, tensors, block)


def _hf_config(ckpt: Checkpoint) -> dict[str, Any]:
    if ckpt.format == "hf":
        return json.loads((ckpt.path / "config.json").read_text())
    c = ckpt.config
    written = {"architectures": [family(c.architecture).hf_architectures[0]], "model_type": c.architecture,
               "vocab_size": c.vocab_size,
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
            "max_position_embeddings": c.max_position_embeddings, "tie_word_embeddings": c.tie_word_embeddings,
            "attention_bias": c.attention_bias, "sliding_window": c.sliding_window,
            "use_sliding_window": c.sliding_window is not None, "bos_token_id": c.bos_token_id,
            "eos_token_id": list(c.eos_token_ids), "torch_dtype": "float32"}
    if hf_config(written) != replace(c, torch_dtype="float32"):
        raise ConfigError(f"tally quantize cannot write {ckpt.path}'s {c.architecture} traits into a config.json; "
                          "quantize the model's Hugging Face checkpoint instead")
    return written


def _write_tokenizer(ckpt: Checkpoint, tokenizer: Tokenizer, out: Path) -> None:
    if ckpt.format == "gguf":  # the tokenizer lives in the GGUF metadata: write it out as HF files
        tokenizer.save_pretrained(str(out))
        return
    for name in _TOKENIZER_FILES:
        if (ckpt.path / name).is_file():
            shutil.copy2(ckpt.path / name, out / name)
