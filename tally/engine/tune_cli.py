"""`tally tune`: measure this CPU's projection paths for a model again and cache the choice, which `tally serve`,
`tally generate` and `LLM` read at start (tally/engine/startup/path_tuning.py). Takes the engine's flags: --dtype and
--quantization narrow the candidates, --threads sets the thread count measured."""
from __future__ import annotations

import argparse
import sys

import torch

from tally.engine.args import add_engine_args, config_from_args
from tally.engine.startup.path_tuning import measured_path
from tally.errors import TallyError
from tally.flags import parser
from tally.models.loader import load_checkpoint
from tally.platform import physical_cores


def build_parser() -> argparse.ArgumentParser:
    p = parser("tally tune", __doc__)
    add_engine_args(p)
    return p


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    try:
        config = config_from_args(ns)
        torch.set_num_threads(config.threads or physical_cores())
        choice = measured_path(config, load_checkpoint(config.model), remeasure=True)
    except TallyError as exc:
        print(f"tally tune: {exc.message}", file=sys.stderr)
        return 2
    print(f"{torch.get_num_threads()} threads; projections' tokens per second by rows per step:")
    for line in choice.table_lines() if choice.measured else []:
        print("  " + line)
    print(f"chosen: {choice.summary()}")
    return 0
