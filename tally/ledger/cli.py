"""`tally plan`: the memory and capacity plan for a model on a device, before anything is allocated."""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys

from tally.errors import TallyError
from tally.flags import (
    BLOCK_SIZE,
    CONCURRENCY,
    DTYPE,
    JSON,
    KV_CACHE_DTYPE,
    OUT,
    MAX_MODEL_LEN,
    MAX_NUM_BATCHED_TOKENS,
    PIPELINE_PARALLEL_SIZE,
    TENSOR_PARALLEL_SIZE,
    parser,
)
from tally.ledger.capacity import pools_section
from tally.ledger.comm import LINKS, Link, find_link
from tally.ledger.length_percentiles import load_lengths, summarize
from tally.ledger.levers import compare_variants, render_comparison
from tally.ledger.link_probe import measure_gloo_link
from tally.ledger.model_source import ModelSource, resolve_model
from tally.ledger.plan import PlanOptions, make_plan
from tally.ledger.presets import Device, device_preset_names, find_device
from tally.ledger.render import render_plan
from tally.units import parse_bandwidth, parse_bytes, parse_flops

EPILOG = """examples:
  tally plan --model Llama-3.1-8B --device h100-80gb --max-model-len 8192 --concurrency 64
  tally plan --model SmolLM2-135M --device cpu --weights int4 --kv-cache-dtype int8
  tally plan --model Qwen2.5-72B --device h100-80gb -tp 4 --lengths trace.csv --compare --json
  tally plan --model Llama-3.1-8B --device h100-80gb --lengths conv --out plan.json   # for route and deploy k8s
"""


def build_parser() -> argparse.ArgumentParser:
    p = parser("tally plan", __doc__, EPILOG)
    p.add_argument("--model", required=True, help="checkpoint dir, .gguf file, config.json, or a preset name")
    p.add_argument("--device", help=f"{', '.join(device_preset_names())}, or cpu (measures this machine)")
    p.add_argument("--probe-size", default="1GiB", help="array the --device cpu bandwidth probe sums")
    p.add_argument("--memory", help="device memory, e.g. 80GiB (overrides the preset)")
    p.add_argument("--bandwidth", help="memory bandwidth, e.g. 3.35TB/s (overrides the preset)")
    p.add_argument("--flops", help="dense bf16 FLOP/s, e.g. 989T (overrides the preset)")
    DTYPE.add(p)
    p.add_argument("--weights", choices=("dense", "int8", "int4", "w8a8", "gguf", "stored"),
                   help="weight format (default: what the model holds: dense at --dtype; a .gguf file or a "
                        "`tally quantize` checkpoint: as stored)")
    p.add_argument("--group-size", type=int, default=128, help="int4 group size")
    KV_CACHE_DTYPE.add(p)
    MAX_MODEL_LEN.add(p, note=" to plan for; with --lengths, the length --percentile of them need")
    p.add_argument("--lengths", help="CSV/JSONL trace, `tally bench` result, or a shipped trace: conv, code")
    p.add_argument("--percentile", type=float, default=99.0, help="share of --lengths the main pool serves")
    CONCURRENCY.add(p, note=" to plan for (default: as many as fit)")
    p.add_argument("--reserve", default="0.12", help="runtime reserve: a fraction of memory (0.12) or a size (12GiB)")
    TENSOR_PARALLEL_SIZE.add(p)
    PIPELINE_PARALLEL_SIZE.add(p)
    BLOCK_SIZE.add(p)
    MAX_NUM_BATCHED_TOKENS.add(p, note="; sizes the tensor / pipeline parallel buffers")
    p.add_argument("--link", help=f"between split devices: {', '.join(LINKS)}, or gloo (measures two processes "
                   "here); default: gloo with --device cpu, else nvlink4")
    p.add_argument("--compare", action="store_true", help="show weight / KV / attention options side by side")
    JSON.add(p)
    OUT.add(p, note=": with --lengths, the plan as JSON with its two pools (main and long), which `tally route "
                    "--long-threshold` and `tally deploy k8s --plan` read")
    return p


def _device(args: argparse.Namespace) -> Device:
    if args.device == "cpu":
        from tally.ledger.hardware import probe_cpu

        device = probe_cpu(parse_bytes(args.probe_size, what="--probe-size"))
    elif args.device:
        device = find_device(args.device)
    elif not (args.memory and args.bandwidth and args.flops):
        raise TallyError("give --device (a preset or cpu), or all of --memory, --bandwidth and --flops")
    else:
        device = Device("custom", 0, 0.0, 0.0)
    overrides = {}
    if args.memory:
        overrides["memory_bytes"] = parse_bytes(args.memory, what="--memory")
    if args.bandwidth:
        overrides["bandwidth_bytes_per_s"] = parse_bandwidth(args.bandwidth)
    if args.flops:
        overrides["flops_per_s"] = parse_flops(args.flops)
    return Device(**{**device.__dict__, **overrides})


def _link(args: argparse.Namespace) -> Link | None:
    """What the split devices talk over; only a split model needs one."""
    if args.tensor_parallel_size * args.pipeline_parallel_size == 1:
        return None
    name = args.link or ("gloo" if args.device == "cpu" else "nvlink4")
    if name != "gloo":
        try:
            return find_link(name)
        except ValueError as exc:
            raise TallyError(str(exc)) from None
    if importlib.util.find_spec("torch") is None:
        raise TallyError(f"measuring the gloo link needs torch (pip install 'tally[serve]'); or name a link with "
                         f"--link ({', '.join(LINKS)})")
    return measure_gloo_link()


def _options(args: argparse.Namespace, source: ModelSource) -> PlanOptions:
    for name in ("tensor_parallel_size", "pipeline_parallel_size", "block_size", "max_num_batched_tokens"):
        if getattr(args, name) < 1:
            raise TallyError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    reserve = float(args.reserve) if _is_number(args.reserve) else parse_bytes(args.reserve, what="--reserve")
    return PlanOptions(
        device=_device(args),
        dtype=source.auto_dtype if args.dtype == "auto" else args.dtype,
        weights=args.weights,
        group_size=args.group_size,
        kv_dtype=None if args.kv_cache_dtype == "auto" else args.kv_cache_dtype,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        concurrency=args.concurrency,
        reserve=reserve,
        tp=args.tensor_parallel_size,
        pp=args.pipeline_parallel_size,
        max_batched_tokens=args.max_num_batched_tokens,
        link=_link(args),
        percentile=args.percentile,
        lengths=summarize(load_lengths(args.lengths)) if args.lengths else None,
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.out is not None and (args.lengths is None or args.compare):
        print("tally plan: --out writes the main and long pools a --lengths trace calls for; give --lengths (and "
              "no --compare)", file=sys.stderr)
        return 2
    try:
        source = resolve_model(args.model)
        opts = _options(args, source)
        if args.compare:
            rows = compare_variants(source, opts)
            if args.json:
                print(json.dumps([{"option": label, **plan.to_dict()} for label, plan in rows], indent=2))
            else:
                print(render_comparison(rows))
            return 0
        plan = make_plan(source, opts)
    except TallyError as exc:
        print(f"tally plan: {exc.message}", file=sys.stderr)
        return 2
    print(json.dumps(plan.to_dict(), indent=2) if args.json else render_plan(plan))
    if args.out is not None:
        try:
            args.out.write_text(json.dumps({"pools": pools_section(plan.long_tail, plan.concurrency),
                                            **plan.to_dict()}, indent=2) + "\n")
        except OSError as exc:
            print(f"tally plan: --out {args.out}: {exc.strerror}", file=sys.stderr)
            return 2
        print(f"wrote {args.out}: requests above {plan.long_tail.max_model_len:,} tokens go to the long pool",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
