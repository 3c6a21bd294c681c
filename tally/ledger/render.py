"""A plan as the table people read: each line a number with its unit and, where it helps, its formula."""
from __future__ import annotations

import math

from tally.ledger.kv import KV_DTYPE_BYTES
from tally.ledger.plan import Plan
from tally.ledger.weights import short_dtype
from tally.units import fmt_count, fmt_gb, fmt_gib, fmt_rate, fmt_small_bytes

UNITS_NOTE = ("units: GB = 10^9 B, GiB = 2^30 B; device memory, reserve and KV in GiB (an '80 GB' card "
              "holds 80 GiB); bandwidth and FLOP/s decimal")
_WIDTH = 30


def _row(label: str, value: str) -> str:
    return f"  {label:<{_WIDTH}}{value}"


def render_plan(plan: Plan) -> str:
    m, w, kv, mem = plan.model, plan.weights, plan.kv, plan.memory
    lines = [f"tally plan: {m.name} on {plan.device.name}", UNITS_NOTE, "", "Model"]
    lines.append(_row("parameters", f"{fmt_count(m.num_params)} ({m.num_params:,}); "
                      f"{fmt_count(m.matmul_params)} in matmuls"))
    lines.append(_row("shape", f"{m.architecture}, {m.num_layers} layers, hidden {m.hidden_size}, "
                      f"{m.num_heads} heads / {m.num_kv_heads} KV heads x {m.head_dim}, vocab {m.vocab_size:,}"
                      f"{', tied embeddings' if m.tied_embeddings else ''}, context {m.max_position_embeddings:,}"))
    lines += ["", f"Weights: {w.format}"]
    if w.gguf_tensor_types:
        lines.append(_row("stored types", ", ".join(f"{k} x{v}" for k, v in sorted(w.gguf_tensor_types.items()))))
    lines.append(_row("whole model", f"{fmt_gb(w.total_bytes)} ({fmt_gib(w.total_bytes)})"))
    lines += ["", f"KV cache: {short_dtype(kv.dtype)}, blocks of {kv.block_size} tokens"]
    scales = " + scales" if kv.dtype in ("int8", "fp8") else ""
    lines.append(_row("per token", f"2 x {m.num_layers} layers x {m.num_kv_heads} KV heads x {m.head_dim} x "
                      f"{KV_DTYPE_BYTES[kv.dtype]} B{scales} = {fmt_small_bytes(kv.bytes_per_token)}"))
    if plan.split.num_devices > 1:
        lines.append(_row("per token, per device", fmt_small_bytes(kv.bytes_per_token_per_device)))
    lines.append(_row("per block, per device", fmt_small_bytes(kv.bytes_per_block_per_device)))
    lines.append(_row(f"per request @ {plan.planned_len:,} tokens", fmt_small_bytes(kv.bytes_per_request_per_device)))
    lines += ["", "Memory per device"]
    lines.append(_row("device", fmt_gib(mem.device_bytes)))
    lines.append(_row("- runtime reserve", f"{fmt_gib(mem.reserve_bytes)} ({mem.reserve_bytes / mem.device_bytes:.0%})"))
    if mem.comm_buffer_bytes:
        lines.append(_row("- communication buffers", fmt_gib(mem.comm_buffer_bytes)))
    lines.append(_row("- weights", f"{fmt_gib(mem.weight_bytes)} ({fmt_gb(mem.weight_bytes)})"))
    lines.append(_row("= KV pool", f"{fmt_gib(mem.kv_pool_bytes)} = {mem.kv_blocks:,} blocks = "
                      f"{mem.kv_tokens:,} tokens"))
    lines.append(_row(f"max concurrency @ {plan.planned_len:,}", f"{plan.max_concurrency:,} requests "
                      f"(KV pool / KV per request)"))
    lines += ["", f"Roofline (lower bounds at {fmt_rate(plan.device.bandwidth_bytes_per_s, 'B/s')}, "
              f"{fmt_rate(plan.device.flops_per_s, 'FLOP/s')}{', measured' if plan.device.measured else ''})"]
    for est in (plan.decode_one, plan.decode_at_concurrency):
        lines.append(_row(f"decode, {est.concurrency} request{'s' if est.concurrency > 1 else ''}",
                          f"{est.ms_per_token:,.2f} ms/token, {est.tokens_per_s:,.1f} tokens/s "
                          f"({est.bound}-bound: {fmt_gb(est.bytes_per_step)} read per step "
                          f"at context {est.context_tokens:,})"))
    for p in plan.prefill:
        lines.append(_row(f"TTFT, {p.label}", f"{p.ttft_s * 1e3:,.1f} ms ({p.prompt_tokens:,} tokens, idle device)"))
    if plan.split.num_devices > 1:
        lines += _split_lines(plan)
    if plan.lengths is not None and plan.long_tail is not None:
        lines += _lengths_lines(plan)
    if plan.warnings:
        lines += ["", "Warnings"] + [f"  ! {w}" for w in plan.warnings]
    return "\n".join(lines)


def _split_lines(plan: Plan) -> list[str]:
    s = plan.split
    return ["", f"Parallel: tp {s.tp} x pp {s.pp} = {s.num_devices} devices",
            _row("weights per device by stage", ", ".join(fmt_gib(b) for b in s.stage_weight_bytes)),
            _row("activation buffers", f"{fmt_gib(s.activation_buffer_bytes)} (TP all-gathers / stage send+recv)"),
            *([_row("NCCL buffers", fmt_gib(s.nccl_bytes))] if s.nccl_bytes else []), *_comm_lines(plan)]


def _comm_lines(plan: Plan) -> list[str]:
    c = plan.comm_one
    if c is None:
        return [_row("communication per step", "not predicted (no --link)")]
    return [_row("communication, 1 request", f"{c.seconds * 1e3:,.2f} ms a step: {c.collectives} collectives/sends "
                 f"over {c.link}, {fmt_small_bytes(c.bytes_per_rank)} per rank; "
                 f"{plan.decode_at_concurrency.comm_s * 1e3:,.2f} ms at {plan.decode_at_concurrency.concurrency}")]


def _lengths_lines(plan: Plan) -> list[str]:
    s, t = plan.lengths, plan.long_tail
    order = ("p50", "p90", "p99", "p99.5", "max")

    def dist(values: dict[str, int]) -> str:
        return " / ".join(f"{values[k]:,}" for k in order)

    return ["", f"Lengths ({s.num_requests:,} requests): p50 / p90 / p99 / p99.5 / max",
            _row("prompt tokens", dist(s.prompt_tokens)),
            _row("output tokens", dist(s.output_tokens)),
            _row("total tokens", f"{dist(s.total_tokens)} (mean {s.mean_total_tokens:,.0f})"),
            _row(f"max_model_len at p{t.percentile:g}", f"{t.max_model_len:,} tokens: {t.concurrency_at_max_model_len:,} "
                 f"concurrent requests fit"),
            _row("at the mean length", f"{math.ceil(s.mean_total_tokens):,} tokens: about {t.concurrency_at_mean_len:,} "
                 "in flight on average (paged blocks), not guaranteed"),
            _row("at the theoretical maximum", f"{t.theoretical_max_len:,} tokens: "
                 f"{t.concurrency_at_theoretical_max_len:,} concurrent requests fit"),
            _row("long tail", f"{t.tail_request_share:.2%} of requests ({t.tail_slot_share:.2%} of in-flight slots) "
                 f"are longer than {t.max_model_len:,}"),
            _row("long-tail pool", f"{t.tail_concurrency} slot{'s' if t.tail_concurrency != 1 else ''} x {t.tail_max_len:,} tokens = "
                 f"{fmt_gib(t.tail_pool_bytes)} of KV")]
