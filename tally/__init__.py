"""Tally: an LLM inference engine that counts before it optimises."""
from __future__ import annotations

from tally.outputs import CompletionOutput, RequestOutput
from tally.sampling_params import SamplingParams
from tally.version import __version__

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]


def __getattr__(name: str):
    # Lazy so that `tally plan` and `tally bench` never import torch.
    if name == "LLM":
        from tally.engine.llm import LLM

        return LLM
    raise AttributeError(name)
