"""`tally quantize`: write a GPTQ / AWQ / RTN / SmoothQuant (W8A8) quantized checkpoint that
`tally serve --model DIR` loads as is."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tally.errors import TallyError
from tally.flags import MODEL, OUT, parser
from tally.quantize.scheme import SCHEME_HELP


def build_parser() -> argparse.ArgumentParser:
    p = parser("tally quantize", __doc__)
    MODEL.add(p)
    p.add_argument("--scheme", required=True, help=SCHEME_HELP)
    p.add_argument("--method", default="gptq", help="gptq, awq, rtn, or smoothquant (with --scheme w8a8)")
    p.add_argument("--alpha", type=float, default=0.5,
                   help="smoothquant: how much of the activations' range moves into the weights, 0..1")
    p.add_argument("--calib", type=Path, default=None,
                   help="JSONL of prompts ({'prompt': ...} or {'messages': [...]}) like the deployment's traffic, "
                        "or a tally serve --request-log DIR written with --log-prompts")
    p.add_argument("--samples", type=int, default=256, help="calibration samples to use")
    p.add_argument("--max-seq-length", type=int, default=512,
                   help="tokens of each calibration sample at most, longer ones cut (llm-compressor's name)")
    p.add_argument("--act-order", action="store_true", help="GPTQ: quantize columns by decreasing activation energy")
    mixed = p.add_mutually_exclusive_group()
    mixed.add_argument("--keep-high-precision", default=None,
                       help="comma list of layers kept dense: first, last, lm_head, or layer indices")
    mixed.add_argument("--auto-mixed", type=int, default=0, metavar="K",
                       help="keep the K decoder layers whose quantization hurts the output most dense")
    p.add_argument("--deployment-system-prompt", default=None, metavar="TEXT",
                   help="the system prompt the deployment sends; prepended to samples that have none")
    OUT.add(p, required=True, note=": the quantized checkpoint's folder")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from tally.progress import on_stderr
    from tally.quantize.layer import QuantizeOptions
    from tally.quantize.pipeline import QuantizeJob, run
    from tally.quantize.scheme import parse_scheme

    try:
        job = QuantizeJob(model=args.model, out=args.out, calib=args.calib, samples=args.samples,
                          max_tokens=args.max_seq_length, keep_high_precision=args.keep_high_precision,
                          auto_mixed=args.auto_mixed, deployment_system_prompt=args.deployment_system_prompt,
                          options=QuantizeOptions(parse_scheme(args.scheme), args.method, args.act_order, args.alpha))
        result = run(job, log=lambda line: print(line, file=sys.stderr), track=on_stderr)
    except TallyError as exc:
        print(f"tally quantize: {exc.message}", file=sys.stderr)
        return 2
    if result.sensitivity:
        ranked = sorted(result.sensitivity.items(), key=lambda kv: -kv[1])
        print("layer sensitivity (relative error of final hidden states, that layer alone quantized):")
        for index, err in ranked:
            print(f"  layer {index:3d}  {err:.3e}{'  kept dense' if index in result.dense_layers else ''}")
    print(f"wrote {result.out} ({job.options.scheme.label()}, {job.options.method}; dense layers: "
          f"{result.dense_layers or 'none'}); serve it with: tally serve --model {result.out}")
    return 0
