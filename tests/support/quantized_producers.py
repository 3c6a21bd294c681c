"""Quantized checkpoints written by the tools people download them from, run here on CPU: compressed-tensors (the
format llm-compressor writes and vLLM reads) and AutoAWQ; and each producer's own dequantized weights as the fp32
reference. llm-compressor itself pins an older transformers than ours, so its round-to-nearest recipe is done here
with compressed-tensors' own calls: min/max per group, `calculate_qparams`, `ModelCompressor`.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch


def _copy_tokenizer(src: Path, out: Path) -> None:
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")) or f.name == "generation_config.json":
            shutil.copy(f, out)


def write_compressed_tensors(src: Path, out: Path, preset: str, group_size: int = 32,
                             storage: str | None = None) -> Path:
    """`src` (an HF directory, or a GGUF file transformers dequantizes) quantized with compressed-tensors' preset
    scheme ("W4A16", "W4A16_ASYM", "W8A16", "W8A8"), round to nearest (llm-compressor's QuantizationModifier without
    calibration data), lm_head kept dense, saved to `out` in the format compressed-tensors picks or `storage`
    ("naive-quantized": one int8 per weight)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams, is_module_quantized
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = {"gguf_file": src.name} if src.suffix == ".gguf" else {}
    model = AutoModelForCausalLM.from_pretrained(str(src.parent if where else src), dtype=torch.float32, **where)
    model.hf_quantizer = None  # a GGUF's weights are dequantized dense ones now; transformers would refuse to save them
    scheme = preset_name_to_scheme(preset, ["Linear"])
    if scheme.weights.group_size:
        scheme.weights.group_size = group_size
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    with torch.no_grad():
        for module in model.modules():
            if not is_module_quantized(module):
                continue
            args, w = module.quantization_scheme.weights, module.weight
            grouped = w.view(w.shape[0], -1, args.group_size) if args.strategy == "group" else w[:, None, :]
            scale, zero_point = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
            module.weight_scale.copy_(scale)
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.copy_(zero_point)
    compressor = ModelCompressor.from_pretrained_model(model, storage)
    compressor.compress_model(model)
    model.save_pretrained(str(out))
    compressor.update_config(str(out))
    if where:
        AutoTokenizer.from_pretrained(str(src.parent), **where).save_pretrained(str(out))
    else:
        _copy_tokenizer(src, out)
    return out


def compressed_tensors_reference(path: Path) -> torch.nn.Module:
    """transformers' fp32 model of the checkpoint's weights as compressed-tensors decompresses them."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                quantization_config=CompressedTensorsConfig(dequantize=True))


def write_autoawq(src: Path, out: Path, group_size: int = 32) -> Path:
    """`src` quantized by AutoAWQ (GEMM layout, zero points) on a few lines of text. Without its clipping search:
    that splits the outputs into batches of 64, which these tiny layers' 32 rows do not fill."""
    from awq import AutoAWQForCausalLM
    from support.tiny_models import CORPUS
    from transformers import AutoTokenizer

    model = AutoAWQForCausalLM.from_pretrained(str(src), device_map="cpu")
    model.quantize(AutoTokenizer.from_pretrained(str(src)), calib_data=CORPUS, max_calib_samples=8,
                   max_calib_seq_len=32, apply_clip=False,
                   quant_config={"zero_point": True, "q_group_size": group_size, "w_bit": 4, "version": "GEMM"})
    model.save_quantized(str(out))
    _copy_tokenizer(src, out)
    return out


def autoawq_reference(src: Path, path: Path) -> torch.nn.Module:
    """transformers' fp32 model of AutoAWQ's checkpoint: its dense tensors (norms AWQ rescaled) as stored, each packed
    projection as AutoAWQ's own `dequantize_gemm` unpacks it."""
    from awq.utils.packing_utils import dequantize_gemm
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    stored = load_file(str(path / "model.safetensors"))
    group = json.loads((path / "config.json").read_text())["quantization_config"]["group_size"]
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in stored.items():
            if name in params:
                params[name].copy_(tensor.float())
            elif name.endswith(".qweight"):
                base = name.removesuffix(".qweight")
                w_kn = dequantize_gemm(tensor, stored[f"{base}.qzeros"], stored[f"{base}.scales"], 4, group)
                params[f"{base}.weight"].copy_(w_kn.t().float())
    return model
