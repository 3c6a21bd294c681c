"""Tensor and pipeline parallel against one process, same machine, same run: decode tokens/s at 1 and at 32
streams for TP=2 and PP=2, and the time each step spends communicating, beside what the ledger predicts for it
(tally/ledger/comm.py) from the gloo link measured in the same run (tally/ledger/link_probe.py). For TP: the time in
torch.distributed's collectives (the all-gathers around o_proj and down_proj, the embedding's all-reduce and the
logits' all-gather). For PP: the stage boundaries' transfers (hidden states, then logits to rank 0), each timed by
its receiver from the moment both sides were ready (tally/engine/parallel/pipeline.py: the sender's clock travels
with the rows), so the other stage's work is not counted. Also for PP at 1 stream: the time a PP step takes beyond one
process on one core (each stage's core), which holds the transfers and whatever else the split costs.

On a 2-core machine TP=2 gives each rank one core where TP=1 gives its one process both: expect little gain; the
point is what the split costs. `--partial-sums N` instead times TP=2 as it runs by default (o_proj and down_proj
split by their outputs, four all-gathers a layer: one process's bits) against TP=2 with partial sums all-reduced
(batch_invariant off, two all-reduces a layer), the two alternating for N rounds. The collectives' time is counted
by rank 0 (tally/layers/parallel.py:TPGroup); it includes waiting for the other rank to reach the same collective,
so it is an upper bound on the transfer itself.

    python benchmarks/tensor_parallel.py [--model PATH] [--dtype float32] [--quantization none|gguf|...]
                                    [--concurrency 1,32] [--max-tokens 64] [--partial-sums ROUNDS]
"""
from __future__ import annotations

import argparse
import statistics
import time

from closed_loop import closed_loop  # benchmarks/ is on sys.path when a script here runs

from tally import LLM, SamplingParams
from tally.ledger.comm import Link, step_comm
from tally.ledger.link_probe import measure_gloo_link
from tally.models.config import ModelConfig
from tally.traces import DATA_DIR


def prompts(n: int) -> list[str]:
    lines = [line for line in (DATA_DIR / "shakespeare.txt").read_text().splitlines() if len(line) > 40]
    return [f"Continue the play: {lines[(97 * i) % len(lines)]}" for i in range(n)]


def run(tp: int, pp: int, ns: argparse.Namespace, threads: int | None = None,
        batch_invariant: bool = True) -> tuple[dict[int, tuple[float, float, float]], ModelConfig]:
    """concurrency -> (tokens/s, seconds per step, seconds communicating per step); the model's config."""
    kw = dict(dtype=ns.dtype, max_model_len=512, kv_cache_memory=256 * 2**20, tensor_parallel_size=tp,
              pipeline_parallel_size=pp, threads=threads, batch_invariant=batch_invariant)
    if ns.quantization:
        kw["quantization"] = ns.quantization
    llm = LLM(ns.model, **kw)
    params = SamplingParams(temperature=0, max_tokens=ns.max_tokens, ignore_eos=True)
    closed_loop(llm, prompts(2), 1, params)  # warm-up
    out = {}
    try:
        for c in ns.concurrency:
            comm0 = _comm_seconds(llm)
            steps0 = llm.engine.snapshot().num_steps
            started = time.perf_counter()
            tps, _ = closed_loop(llm, prompts(max(2, 2 * c)), c, params)
            elapsed = time.perf_counter() - started
            steps = max(llm.engine.snapshot().num_steps - steps0, 1)
            comm = _comm_seconds(llm) - comm0
            out[c] = (tps, elapsed / steps, comm / steps)
    finally:
        llm.engine.shutdown()
    return out, llm.engine.model.cfg


def _comm_seconds(llm: LLM) -> float:
    """Rank 0's count of time spent communicating since start: TP collectives and PP transfers."""
    tp_group, parallel = llm.engine.model.tp, llm.engine.parallel
    pipe = parallel.pipe if parallel is not None else None
    return (tp_group.comm_seconds if tp_group else 0.0) + (pipe.clock.seconds if pipe else 0.0)


def predicted_comm_s(cfg: ModelConfig, concurrency: int, link: Link, *, tp: int = 1, pp: int = 1) -> float:
    """The ledger's communication for a decode step of `concurrency` requests (fp32 activations, the default split)."""
    return step_comm(cfg, tp=tp, pp=pp, tokens=concurrency, logit_rows=concurrency, activation_bytes=4,
                     link=link).seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--quantization", default=None)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--partial-sums", type=int, default=0, metavar="ROUNDS",
                   help="time TP=2 exact against TP=2 with partial sums, alternating for this many rounds")
    ns = p.parse_args()
    started = time.perf_counter()
    if ns.partial_sums:
        compare_partial_sums(ns)
        print(f"({time.perf_counter() - started:.0f} s)")
        return
    link = measure_gloo_link()
    (one, cfg), (two, _), (stages, _) = run(1, 1, ns), run(2, 1, ns), run(1, 2, ns)
    one_core, _ = run(1, 1, ns, threads=1)
    print(f"model {ns.model or 'smollm2-135m'}, dtype {ns.dtype}, quantization {ns.quantization or 'default'}, "
          f"{ns.max_tokens} tokens per request; gloo link measured: {link.latency_s * 1e3:.2f} ms a collective, "
          f"{link.bandwidth_bytes_per_s / 1e9:.2f} GB/s")
    print(f"{'streams':>8} {'one tok/s':>10} {'TP=2 tok/s':>11} {'ratio':>6} {'PP=2 tok/s':>11} {'ratio':>6}")
    for c in ns.concurrency:
        t1, t2, tp2 = one[c][0], two[c][0], stages[c][0]
        print(f"{c:>8} {t1:>10.1f} {t2:>11.1f} {t2 / t1:>6.2f} {tp2:>11.1f} {tp2 / t1:>6.2f}")
    print("communication per step, measured by rank 0 (TP: inside collectives; PP: transfers from both sides ready)")
    print(f"{'split':>6} {'streams':>8} {'ms/step':>8} {'comm ms':>8} {'share':>6} {'ledger ms':>10} "
          f"{'measured/ledger':>16}")
    for split, runs, kw in (("TP=2", two, {"tp": 2}), ("PP=2", stages, {"pp": 2})):
        for c in ns.concurrency:
            _, step_s, comm = runs[c]
            predicted = predicted_comm_s(cfg, c, link, **kw)
            print(f"{split:>6} {c:>8} {step_s * 1e3:>8.2f} {comm * 1e3:>8.2f} {comm / step_s:>6.0%} "
                  f"{predicted * 1e3:>10.2f} {comm / predicted:>16.2f}")
    print("PP=2 at 1 stream beside one process on one core (each stage's core): what the split costs in all")
    print(f"{'streams':>8} {'1-core ms/step':>15} {'PP=2 ms/step':>13} {'beyond':>8} {'of it, transfers':>17}")
    for c in (c for c in ns.concurrency if c == 1):
        beyond = stages[c][1] - one_core[c][1]
        print(f"{c:>8} {one_core[c][1] * 1e3:>15.2f} {stages[c][1] * 1e3:>13.2f} {beyond * 1e3:>8.2f} "
              f"{stages[c][2] * 1e3:>17.2f}")
    print(f"({time.perf_counter() - started:.0f} s)")


def compare_partial_sums(ns: argparse.Namespace) -> None:
    """TP=2 by default (all-gathers, exact) against TP=2 with partial sums (all-reduces), in alternating rounds."""
    rounds: list[tuple[dict, dict]] = []
    for _ in range(ns.partial_sums):
        exact, _ = run(2, 1, ns)
        partial, _ = run(2, 1, ns, batch_invariant=False)
        rounds.append((exact, partial))
    print(f"model {ns.model or 'smollm2-135m'}, dtype {ns.dtype}, quantization {ns.quantization or 'default'}, "
          f"{ns.max_tokens} tokens per request, TP=2, {ns.partial_sums} alternating rounds "
          "(medians; each round's ratio)")
    print(f"{'streams':>8} {'exact tok/s':>12} {'comm ms':>8} {'partial sums tok/s':>19} {'comm ms':>8} "
          f"{'ratio':>6}  rounds")
    for c in ns.concurrency:
        ratios = [e[c][0] / p[c][0] for e, p in rounds]
        med = [statistics.median(r[side][c][i] for r in rounds) for side in (0, 1) for i in (0, 2)]
        print(f"{c:>8} {med[0]:>12.1f} {med[1] * 1e3:>8.2f} {med[2]:>19.1f} {med[3] * 1e3:>8.2f} "
              f"{statistics.median(ratios):>6.2f}  {' '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
