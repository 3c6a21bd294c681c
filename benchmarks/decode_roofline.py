"""Batch-1 decode speed against the memory-bandwidth roofline measured in the same run, and the
per-step time spent outside the model's kernels (Python overhead). Where the layers run in one native call, each
decode step is split three ways: that call, the LM head, and everything else the engine's step did (inputs,
embedding, final norm, sampling, scheduling: Python and torch ops), the first two with the bytes they read and
their rate against plain loads over 1 GB (the native kernels' threads, huge pages as the weights'), read just
before each decode run: on a VM the read rate drifts within minutes, so each run is held against its own. Both
with LLM()'s multi-step decode (several decode steps a native call: tally/engine/multi_step.py) and with one step a
call, as `tally serve` runs them, the two alternating request by request (3 each), and the ratio of their TPOTs pair
by pair.

    python benchmarks/decode_roofline.py [--dtype float32] [--quantization int4] [--tokens 128] [--threads 2]
        [--compressed-tensors W4A16]  (the model as compressed-tensors writes it: llm-compressor's format)
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch

if TYPE_CHECKING:
    from tally.engine.engine import Engine


def read_buffer(size_bytes: int = 1 << 30) -> torch.Tensor:
    """What the read rate is measured over: huge pages, as the weights are held (tally/layers/huge_pages.py)."""
    from tally.layers.huge_pages import huge_page_buffer

    buf = huge_page_buffer(size_bytes)
    return (torch.empty(size_bytes, dtype=torch.uint8) if buf is None else buf).fill_(1)  # backed, not just mapped


def read_gbs(buf: torch.Tensor, repeats: int = 3) -> float:
    """The memory's read rate with plain loads on the kernels' threads; torch's sum where the native kernels are
    unavailable (its arithmetic, not the memory, limits it, below what plain loads read)."""
    from tally.native import ops

    if not ops.available():
        x = buf.view(torch.float32)
        return buf.nbytes / min(_timed(lambda: x.sum()) for _ in range(repeats)) / 1e9
    return buf.nbytes / ops.read_seconds(buf, repeats) / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def weight_bytes_read_per_step(model: torch.nn.Module, weight_bytes: int) -> int:
    """A decode step reads every weight once, except the embedding table when the LM head is a separate copy
    (untied, or fp16 weights, where the packed head cannot serve the lookup): it reads one row of it."""
    if model.embed_tokens is None:  # looked up in the head (one copy), or in a GGUF table's own blocks
        blocks = getattr(model, "embed_blocks", None)
        return weight_bytes - (blocks.weight_nbytes() if blocks is not None else 0)
    head = getattr(model.lm_head, "weight", None)
    if head is not None and head.data_ptr() == model.embed_tokens.data_ptr():
        return weight_bytes
    return weight_bytes - model.embed_tokens.numel() * model.embed_tokens.element_size()


class StepSplit:
    """Per decode step that ran the layers' native call: (the step, that call, the LM head) in seconds; the head's 0
    where the call ran it too (tally/models/native_decode_step.py: a step that ends in the logits). A burst of k
    decode steps in one call (tally/engine/multi_step.py) counts as k steps of a k-th of its times each."""

    def __init__(self, engine: Engine) -> None:
        self.steps: list[tuple[float, float, float]] = []
        self._layers = self._head = 0.0
        self._burst = 1
        model = engine.model
        run, greedy, logits, step = model.native_step.run, model.native_step.greedy, model.compute_logits, engine.step

        def timed_run(*args):
            t0 = time.perf_counter()
            out = run(*args)
            self._layers += time.perf_counter() - t0
            return out

        def timed_greedy(*args):
            t0 = time.perf_counter()
            out = greedy(*args)
            self._layers += time.perf_counter() - t0
            self._burst = out.shape[1]  # the steps it ran
            return out

        def timed_logits(*args):
            t0 = time.perf_counter()
            out = logits(*args)
            self._head += time.perf_counter() - t0
            return out

        def timed_step():
            self._layers = self._head = 0.0
            self._burst = 1
            t0 = time.perf_counter()
            out = step()
            if self._layers:
                k = self._burst
                self.steps.extend([((time.perf_counter() - t0) / k, self._layers / k, self._head / k)] * k)
            return out

        # instance attributes over the methods: this engine only, nothing patched for anyone else
        model.native_step.run, model.native_step.greedy = timed_run, timed_greedy
        model.compute_logits, engine.step = timed_logits, timed_step

    def medians(self) -> tuple[float, float, float]:
        return tuple(statistics.median(column) for column in zip(*self.steps))


def head_bytes(model: torch.nn.Module) -> int:
    head = model.lm_head
    if hasattr(head, "weight_nbytes"):
        return head.weight_nbytes()
    return sum(t.numel() * t.element_size() for t in [*head.parameters(), *head.buffers()])


def compressed_copy(model: str | None, out: Path, preset: str, group_size: int) -> Path:
    """compressed-tensors' checkpoint of `model`, as the tests write it (tests/support/quantized_producers.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.quantized_producers import write_compressed_tensors

    from tally.models.registry import resolve_model

    return write_compressed_tensors(Path(resolve_model(model).path), out, preset, group_size)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default=None)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compressed-tensors", metavar="PRESET", help="serve the model as compressed-tensors quantizes it "
                   "with this preset (W4A16, W8A16, W8A8; groups of --group-size), written to a temporary directory")
    p.add_argument("--group-size", type=int, default=64)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from tally import LLM, SamplingParams

    scratch = tempfile.TemporaryDirectory()
    if a.compressed_tensors:
        out = Path(scratch.name) / f"compressed-tensors-{a.compressed_tensors.lower()}"
        a.model = str(compressed_copy(a.model, out, a.compressed_tensors, a.group_size))
    llm = LLM(a.model, dtype=a.dtype, quantization=a.quantization, max_model_len=1024, kv_cache_memory=256 * 2**20)
    ledger = llm.engine.ledger
    params = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))  # warm up
    engine, model = llm.engine, llm.engine.model
    buf = read_buffer()
    kv_bytes = ledger.kv_bytes_per_token * 64  # ~64 tokens of context read per step on average
    read_bytes = weight_bytes_read_per_step(model, ledger.weight_bytes)
    print(f"\nmodel {ledger.model_name}, compute {model.dtype}, projections {type(model.layers[0].qkv_proj).__name__}, "
          f"{a.threads} threads")
    print(f"{'figure':<44} {'value':>12}")
    print(f"{'weight bytes held / read per step':<44} {ledger.weight_bytes / 1e6:>6.1f} / {read_bytes / 1e6:.1f} MB")
    # LLM()'s multi-step decode and one step a call as tally serve runs (the engine's limit flipped in place),
    # alternating request by request so that the machine's drift falls on both
    limits = [engine._burst_limit] + ([1] if engine._burst_limit > 1 else [])
    split = StepSplit(engine) if model.native_step is not None else None
    runs: dict[int, list[float]] = {limit: [] for limit in limits}
    rates: dict[int, list[float]] = {limit: [] for limit in limits}  # GB/s read just before each run
    steps: dict[int, list[tuple[float, float, float]]] = {limit: [] for limit in limits}
    for _ in range(3):
        for limit in limits:
            engine._burst_limit = limit
            if split is not None:
                split.steps = steps[limit]
            rates[limit].append(read_gbs(buf))
            runs[limit].append(decode_seconds(llm, params))
    every_rate = [r for limit in limits for r in rates[limit]]
    bw = statistics.median(every_rate)
    print(f"{'memory read rate (plain loads, before each run)':<44} {bw:>9.1f} GB/s  "
          f"({min(every_rate):.1f}-{max(every_rate):.1f})")
    print(f"{'roofline decode at that rate':<44} {bw * 1e9 / (read_bytes + kv_bytes):>8.1f} tok/s")
    for limit in limits:
        step_s = statistics.median(runs[limit])
        tok_s = 1 / step_s
        # each run against the roofline of the read rate measured just before it
        of_roofline = sorted((read_bytes + kv_bytes) / run_s / (rate * 1e9)
                             for run_s, rate in zip(runs[limit], rates[limit]))
        label = f"{limit} decode steps a call at most" if limit > 1 else "one decode step a call"
        print(f"{'tally batch-1 decode (median of 3)':<44} {tok_s:>8.1f} tok/s   ({label})")
        if model.native_step is None:  # Python overhead: the same steps with the profiler's view of torch kernel time
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
            kernel_s = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6 / 16
            print(f"{'per step: measured / in torch ops':<44} {step_s * 1e3:>6.1f} / {kernel_s * 1e3:.1f} ms")
        else:  # the layers run inside one native call, which the torch profiler does not see
            split.steps = steps[limit]
            print_split(split, model, read_bytes, bw)
        spread = f"({of_roofline[0]:.0%}-{of_roofline[-1]:.0%})"
        print(f"{'tally / roofline, run by run':<44} {of_roofline[1]:>11.0%}  {spread}")
    if len(limits) > 1:
        pairs = sorted(one / burst for burst, one in zip(runs[limits[0]], runs[1]))
        print(f"{'TPOT one step a call / bursts, 3 pairs':<44} {pairs[1]:>11.2f}x  ({pairs[0]:.2f}-{pairs[-1]:.2f})")
    print("command: python " + " ".join(sys.argv))


def decode_seconds(llm, params) -> float:
    """Seconds a decode step of one request (first token to last over the tokens between)."""
    out = llm.generate("Once upon a time", params)[0]
    m = out.metrics
    return (m.last_token_time - m.first_token_time) / (len(out.outputs[0].token_ids) - 1)


def print_split(split: StepSplit, model: torch.nn.Module, read_bytes: int, bw: float) -> None:
    step, layers, head = split.medians()
    lm_bytes = head_bytes(model)
    print(f"{'per decode step, median of ' + str(len(split.steps)):<44} {step * 1e3:>6.2f} ms")
    parts = [("  the layers (one native call)", layers, read_bytes - lm_bytes), ("  the LM head", head, lm_bytes)]
    if not head:
        parts = [("  layers, norm and LM head (one native call)", layers, read_bytes)]
    for name, seconds, nbytes in parts:
        gbs = nbytes / seconds / 1e9
        print(f"{name:<44} {seconds * 1e3:>6.2f} ms  {nbytes / 1e6:.1f} MB  {gbs:.1f} GB/s ({gbs / bw:.0%} of "
              "the read rate)")
    rest = step - layers - head
    print(f"{'  everything else (Python and torch ops)':<44} {rest * 1e3:>6.2f} ms  {rest / step:.0%} of the step")


if __name__ == "__main__":
    main()
