"""Tally: an LLM inference engine that counts before it optimises."""
from __future__ import annotations

import logging
import os
import sys

# OpenMP's waiting threads spin by default: with one other busy process on the machine they take the core from
# the thread doing the work, and a step slows many times over (docs/benchmarks.md#kernels). libgomp reads this
# once, when torch loads it, so it is set before anything imports torch; a value the user set wins.
if "torch" in sys.modules and "OMP_WAIT_POLICY" not in os.environ:  # too late: libgomp has read it
    logging.getLogger(__name__).warning(
        "torch was imported before tally, so its OpenMP threads spin between operations and slow the native "
        "kernels' own threads; import tally first or set OMP_WAIT_POLICY=PASSIVE")
# What the user's environment held, for programs started from here that are not Tally (benchmarks/peer_env.py): a
# llama.cpp that inherits PASSIVE waits through the hypervisor at each barrier and decodes slower.
OMP_WAIT_POLICY_OF_USER = os.environ.get("OMP_WAIT_POLICY")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tally.lora_request import LoRARequest
from tally.outputs import CompletionOutput, RequestOutput
from tally.sampling_params import SamplingParams
from tally.version import __version__

__all__ = ["LLM", "LoRARequest", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]


def __getattr__(name: str):
    # Lazy so that `tally plan` and `tally bench` never import torch.
    if name == "LLM":
        from tally.engine.llm import LLM

        return LLM
    raise AttributeError(name)
