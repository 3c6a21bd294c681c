"""`tally generate`: one prompt, text streamed to the terminal as it is produced."""
from __future__ import annotations

import argparse
import logging
import sys
import time

from tally.engine.args import add_engine_args, config_from_args
from tally.engine.engine import Engine
from tally.engine.parallel.distributed import is_follower
from tally.engine.parallel.follower import follow
from tally.errors import TallyError
from tally.flags import MAX_TOKENS, parser
from tally.models.chat_template import (
    chat_prompt,
    has_chat_template,
    refuse_without_template,
)
from tally.sampling_params import SamplingParams


def build_parser() -> argparse.ArgumentParser:
    p = parser("tally generate", __doc__)
    p.add_argument("--prompt", required=True, help="the user message (the prompt as is with --raw)")
    MAX_TOKENS.add(p, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="sample from the smallest set of tokens this likely")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest tokens; 0: all")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens less likely than this times the likeliest")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="1: none; >1 discourages repeats")
    p.add_argument("--sample-seed", type=int, default=None, help="seed of this request's sampling")
    p.add_argument("--stop", action="append", default=None, help="stop at this text (repeat for several)")
    p.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    p.add_argument("--verbose", "-v", action="store_true", help="log the ledger and timings")
    add_engine_args(p)
    return p


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if ns.verbose else logging.WARNING, format="%(message)s")
    try:
        config = config_from_args(ns)
        if is_follower(config):  # torchrun's ranks 1..N-1 follow rank 0's steps
            return follow(config)
        engine = Engine(config)
        params = SamplingParams(
            temperature=ns.temperature, top_p=ns.top_p, top_k=ns.top_k, min_p=ns.min_p,
            repetition_penalty=ns.repetition_penalty, seed=ns.sample_seed, max_tokens=ns.max_tokens, stop=ns.stop)
        tok = engine.tokenizer
        # Without a chat template (or with --raw) the prompt goes in as plain text, tokenized with the model's BOS.
        if ns.raw or not has_chat_template(tok):
            prompt: str | dict = ns.prompt
        else:
            prompt = chat_prompt(tok, [{"role": "user", "content": ns.prompt}],
                                 without_template=refuse_without_template)
        engine.add_request("cli", prompt, params)
    except TallyError as exc:
        print(f"tally generate: {exc.message}", file=sys.stderr)
        return 2
    shown, t0, first, n_tokens = 0, time.perf_counter(), None, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            comp = out.outputs[0]
            if first is None and comp.token_ids:
                first = time.perf_counter()
            n_tokens = len(comp.token_ids)
            sys.stdout.write(comp.text[shown:])
            sys.stdout.flush()
            shown = len(comp.text)
    sys.stdout.write("\n")
    if ns.verbose and first is not None:
        end = time.perf_counter()
        tpot = (end - first) / max(1, n_tokens - 1)
        print(f"[{n_tokens} tokens, TTFT {first - t0:.3f} s, TPOT {tpot * 1000:.1f} ms]", file=sys.stderr)
    return 0
