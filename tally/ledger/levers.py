"""`tally plan --compare`: the same model and device under each lever (weight format, KV dtype,
grouped-query vs full multi-head attention), side by side, so a team sees which lever buys what."""
from __future__ import annotations

import dataclasses

from tally.ledger.kv import KV_DTYPE_BYTES, auto_kv_dtype
from tally.ledger.model_source import ModelSource
from tally.ledger.plan import Plan, PlanOptions, make_plan
from tally.ledger.weights import short_dtype
from tally.units import fmt_gib, fmt_small_bytes


def compare_variants(source: ModelSource, opts: PlanOptions) -> list[tuple[str, Plan]]:
    """The plan as asked first, then one row per lever that differs from it."""
    base_weights = opts.weights or source.default_weights
    base_kv = opts.kv_dtype or auto_kv_dtype(opts.dtype, base_weights != "dense")
    rows: list[tuple[str, ModelSource, PlanOptions]] = [("as asked", source, opts)]
    for weights in dict.fromkeys((source.default_weights, "dense", "int8", "int4")):
        if weights != base_weights:
            label = short_dtype(opts.dtype) if weights == "dense" else weights
            # the cache as asked stays: auto's choice follows the weights (auto_kv_dtype), one lever a row
            rows.append((f"weights {label}", source, dataclasses.replace(opts, weights=weights, kv_dtype=base_kv)))
    # a 16-bit cache under fp32 compute halves the cache (the CPU engine reads it natively: --kv-cache-dtype float16)
    half = ("float16",) if KV_DTYPE_BYTES[opts.dtype] > 2 else ()
    for kv_dtype in (opts.dtype, *half, "int8", "fp8"):
        if kv_dtype != base_kv:
            rows.append((f"KV {short_dtype(kv_dtype)}", source, dataclasses.replace(opts, kv_dtype=kv_dtype)))
    if base_weights != "int4" and base_kv != "int8":
        rows.append(("weights int4 + KV int8", source, dataclasses.replace(opts, weights="int4", kv_dtype="int8")))
    rows += _attention_variant(source, opts, base_weights)
    return [(label, make_plan(src, o)) for label, src, o in rows]


def _attention_variant(source: ModelSource, opts: PlanOptions, base_weights: str) -> list:
    config = source.config
    if config.num_kv_heads < config.num_heads:
        kv_heads, label = config.num_heads, f"full MHA ({config.num_heads} KV heads)"
    elif config.num_heads % 8 == 0 and config.num_heads > 8:
        kv_heads, label = 8, "GQA (8 KV heads)"
    else:
        return []
    reshaped = source.with_config(dataclasses.replace(config, num_kv_heads=kv_heads), source.name)
    # A reshaped model has no stored GGUF tensors: price it dense.
    weights = "dense" if base_weights == "gguf" else base_weights
    return [(label, reshaped, dataclasses.replace(opts, weights=weights))]


def render_comparison(rows: list[tuple[str, Plan]]) -> str:
    base = rows[0][1]
    header = ("option", "weights/dev", "KV/token", "KV pool tokens", f"fit @{base.planned_len:,}",
              "decode 1 req", "decode @ N", f"TTFT {base.prefill[0].label}")
    table = [header]
    for label, plan in rows:
        at = plan.decode_at_concurrency
        table.append((label, fmt_gib(plan.weights.per_device_bytes), fmt_small_bytes(plan.kv.bytes_per_token).split(" (")[0],
                      f"{plan.memory.kv_tokens:,}", f"{plan.max_concurrency:,}",
                      f"{plan.decode_one.tokens_per_s:,.1f} tok/s", f"{at.tokens_per_s:,.0f} tok/s @ {at.concurrency}",
                      f"{plan.prefill[0].ttft_s * 1e3:,.1f} ms"))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = [f"tally plan --compare: {base.model.name} on {base.device.name}"]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in table]
    return "\n".join(lines)
