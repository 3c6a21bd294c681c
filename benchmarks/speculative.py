"""Speculative decoding on the built-in model (or --model): tokens/s with speculation off, prompt lookup at a fixed K,
and prompt lookup with the adaptive policy, at several concurrencies, on two workloads; with --draft-model, a draft
model at a fixed K and adaptive too (it must share the target's tokenizer: e.g. Qwen2.5-Coder-1.5B-Instruct with
Qwen2.5-Coder-0.5B-Instruct). Greedy: in float32 every arm gives the same tokens; in bf16 a token computed in a
verify row (several positions of one sequence) may round differently from one computed alone, as with any change of
batch shape, so the share of requests whose tokens match `off` exactly is printed beside each figure.

  quote   questions answered by quoting a document given in the prompt (a Shakespeare scene, asked to repeat a
          speech): the output copies the prompt, prompt lookup's best case; 256 tokens an answer, a real quote
  code    code completion: the first lines of a Python function from this repository, after the lines before it
  chat    a user's question through the model's chat template (explain, describe, tell a story), nothing to copy:
          where speculation must cost nothing

A closed loop per concurrency C: C requests in flight on the offline engine, each replaced when it finishes,
--requests-per-slot x C requests (at least --min-requests) a loop; tokens/s counts every generated token over
the loops' whole time, prompts' prefill included; TPOT is the mean time per output token after the first, per
request (the prefill left out: what speculation shortens). After a warm-up loop, each adaptive arm runs loops of
new prompts until its policy has counted --warm-steps steps at C and what its measuring lost there is repaid (a
server that has run a while); then every arm runs --rounds loops, each round over new prompts and with the arms'
order rotated by one, so that drift in the machine's speed falls on every arm alike; ratios are against `off`'s
tokens/s over its rounds. "decode steps" is the same ratio over the engine calls without a prompt chunk, less those
of a paused process (over 20 times the median call): at 16-32 streams most of a run can be prompts' prefill, whose
speed moves between arms by more than speculation's effect (docs/benchmarks.md#speculative-decoding). The policy's
own counts over the rounds follow each adaptive arm: its steps, the share that verified proposals, its measuring
steps, and what measuring lost in off steps per 100 steps (the mechanism, not the clock). Every arm runs on
one engine (one copy of the weights; with --draft-model its KV pool holds both models' KV in every arm, so
the arms have the same pool): each arm is its own Speculator, swapped in for its runs, its adaptive policy kept
from one run to the next as a server's would be. Prefix caching is off, so no arm reuses another's prompts.
Printed per arm: acceptance (accepted / proposed), the acceptance at each proposal position (proposals accepted
there / requests that verified proposals, vLLM's per-position rate), the mean proposals verified per speculating
request (K in effect), and preemptions (there should be none).

    python benchmarks/speculative.py [--concurrency 1,4,16,32] [--workloads quote,code,chat] [--k 6]
                                [--max-tokens N] (default: 256 tokens quoting, 96 otherwise)
                                [--model target.gguf --draft-model draft.gguf] [--arms "draft K fixed,..."]
                                [--rounds 3] [--fixed-k 2,3,4] (prompt lookup fixed at each K, beside adaptive)
                                [--draft-context 0,256] (draft_context_tokens: several give an arm of each)
                                [--draft-vocab 0,32768] (draft_vocab_size: the same) [--warm-steps 500]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import astuple, dataclass, field, replace
from pathlib import Path

from closed_loop import closed_loop  # benchmarks/ is on sys.path when a script here runs

from tally import LLM, SamplingParams
from tally.engine.speculation.config import DRAFT_CONTEXT_TOKENS, NGRAM_SPECULATIVE_TOKENS, SpeculativeConfig
from tally.engine.speculation.draft_proposer import DraftProposer
from tally.engine.speculation.policy import KEEP_STEPS, MEASURE_SHARE, Counters
from tally.engine.speculation.speculator import Speculator
from tally.models.chat_template import chat_prompt, refuse_without_template
from tally.traces import DATA_DIR

ARMS = {
    "off": None,
    "ngram K fixed": {"method": "ngram", "adaptive": False},
    "ngram adaptive": {"method": "ngram"},
}
DRAFT_ARMS = {
    "draft K fixed": {"method": "draft_model", "adaptive": False},
    "draft adaptive": {"method": "draft_model"},
}
PAUSE = 20  # a decode call this many times the median one is a pause of the process (ArmTotals.decode_rate)
SOURCE_FILES = sorted((Path(__file__).resolve().parents[1] / "tally").rglob("*.py"))
ANSWER_TOKENS = {"quote": 256}  # a quote runs on (the speech, then the scene); other answers: 96 tokens
CHAT_ASKS = ("Explain how {} works, as you would to a child.", "Write a short story about {}.",
             "What should a beginner know about {}?", "Describe {} in a few paragraphs.")
CHAT_TOPICS = ("a bicycle", "rain", "a library", "bread", "the moon", "a compass", "bees", "a violin", "the tides",
               "a lighthouse", "coffee", "volcanoes", "chess", "the post office", "snow", "a sailboat")


def quote_prompts(n: int, rng: random.Random, passage_chars: int = 2_000) -> list[str]:
    """The speech begins a third into the scene: ~1,300 characters (~330 tokens) of it to quote."""
    text = (DATA_DIR / "shakespeare.txt").read_text()
    prompts = []
    for _ in range(n):
        start = rng.randrange(10_000, len(text) - 3_000)
        passage = text[start:start + passage_chars]
        opening = passage[passage_chars // 3:passage_chars // 3 + 80]
        prompts.append(f"Read this scene.\n\n{passage}\n\nQuote the speech that begins \"{opening}\" word for word, "
                       f"to its end.\n\n{opening}")
    return prompts


def code_prompts(n: int, rng: random.Random, context_lines: int = 40) -> list[str]:
    prompts = []
    while len(prompts) < n:
        lines = rng.choice(SOURCE_FILES).read_text().splitlines()
        starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ")]
        if starts:
            i = rng.choice(starts)
            prompts.append("\n".join(lines[max(0, i - context_lines):i + 4]) + "\n")
    return prompts


def chat_prompts(llm: LLM, n: int, rng: random.Random) -> list[dict]:
    tokenizer = llm.get_tokenizer()
    return [chat_prompt(tokenizer, [{"role": "user", "content": rng.choice(CHAT_ASKS).format(rng.choice(CHAT_TOPICS))}],
                        without_template=refuse_without_template, add_generation_prompt=True) for _ in range(n)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,4,16,32")
    p.add_argument("--workloads", default="quote,code,chat")
    p.add_argument("--k", type=int, default=NGRAM_SPECULATIVE_TOKENS, help="num_speculative_tokens")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens an answer (default: 256 quoting, else 96)")
    p.add_argument("--requests-per-slot", type=int, default=2)
    p.add_argument("--min-requests", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3, help="rounds of every arm, each over new prompts, the arms' "
                                                          "order rotated by one each round")
    p.add_argument("--context-lines", type=int, default=40, help="code: lines of the file before the function")
    p.add_argument("--passage-chars", type=int, default=2_000, help="quote: characters of the scene in the prompt")
    p.add_argument("--kv-cache-memory", type=int, default=1 << 30)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--model", default=None, help="the target (default: the built-in model)")
    p.add_argument("--draft-model", default=None, help="adds the draft-model arms, this model proposing")
    p.add_argument("--draft-context", default=str(DRAFT_CONTEXT_TOKENS),
                   help="draft_context_tokens of the draft arms; several (comma-separated) give arms of each")
    p.add_argument("--draft-vocab", default="0",
                   help="draft_vocab_size of the draft arms (0: the whole vocabulary); several give arms of each")
    p.add_argument("--arms", default=None, help="comma-separated arms to run (default: all; off always runs)")
    p.add_argument("--fixed-k", default=None, help="prompt lookup at each of these fixed K (comma-separated) "
                                                    "instead of one fixed arm at --k: the adaptive arm's K beside "
                                                    "every fixed one")
    p.add_argument("--warm-steps", type=int, default=KEEP_STEPS,
                   help="before the rounds, each adaptive arm runs loops of new prompts until its policy has counted "
                        "this many steps at the concurrency and its measuring there is repaid (default: the steps "
                        "a price holds before it is measured again)")
    p.add_argument("--step-costs", action="store_true",
                   help="instead: one stream, what a step costs off and at each fixed K up to --k (the first "
                        "workload, the draft model if given, else prompt lookup)")
    a = p.parse_args()
    def params_for(workload: str) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_tokens=a.max_tokens or ANSWER_TOKENS.get(workload, 96))
    windows, vocabs = ([int(v) for v in text.split(",")] for text in (a.draft_context, a.draft_vocab))
    arms = {**ARMS, **({arm + (f" ctx {w}" if len(windows) > 1 else "") + (f" vocab {v}" if len(vocabs) > 1 else ""):
                        {**cfg, "model": a.draft_model, "draft_context_tokens": w, "draft_vocab_size": v}
                        for arm, cfg in DRAFT_ARMS.items() for w in windows for v in vocabs} if a.draft_model else {})}
    if a.fixed_k:
        fixed = arms.pop("ngram K fixed")
        arms = {"off": arms.pop("off"), **{f"ngram K={k} fixed": {**fixed, "num_speculative_tokens": int(k)}
                                          for k in a.fixed_k.split(",")}, **arms}
    if a.arms:
        arms = {arm: cfg for arm, cfg in arms.items()
                if arm == "off" or any(arm.startswith(name) for name in a.arms.split(","))}
    configs = {arm: None if cfg is None else SpeculativeConfig.parse({"num_speculative_tokens": a.k, **cfg})
               for arm, cfg in arms.items()}
    loaded = next((c for c in configs.values() if c is not None and c.model is not None), None)
    llm = LLM(a.model, max_model_len=2048, kv_cache_memory=a.kv_cache_memory, dtype=a.dtype,
              enable_prefix_caching=False, speculative_config=loaded and {"model": loaded.model,
                                                                          "num_speculative_tokens": a.k})
    engine = llm.engine
    draft = engine.speculator.draft if engine.speculator is not None else None
    speculators = {arm: None if c is None else Speculator(c, engine.max_model_len, DraftProposer(
        draft.draft, draft.kv, c.draft_context_tokens, c.draft_vocab_size) if c.model else None)
                   for arm, c in configs.items()}
    workloads = {"quote": lambda n, rng: quote_prompts(n, rng, a.passage_chars),
                 "code": lambda n, rng: code_prompts(n, rng, a.context_lines),
                 "chat": lambda n, rng: chat_prompts(llm, n, rng)}
    if a.step_costs:
        method = {"model": a.draft_model} if draft is not None else {"method": "ngram"}
        proposer = DraftProposer(draft.draft, draft.kv, windows[0], vocabs[0]) if draft is not None else None
        first = a.workloads.split(",")[0]
        step_costs(engine, workloads[first](a.min_requests, random.Random(1)), params_for(first), a.k,
                   method, proposer)
        return
    rows = []
    for workload in a.workloads.split(","):
        params = params_for(workload)
        for c in (int(x) for x in a.concurrency.split(",")):
            n = max(a.min_requests, a.requests_per_slot * c)
            # A warm-up loop first (discarded): the first arm at a new concurrency meets matmul shapes (row counts)
            # the CPU library has not compiled kernels for yet, and the arms after it would gain from that alone.
            # Then --rounds rounds, each over prompts of its own with the arms in an order rotated by one: a VM's
            # speed drifts within minutes, and arms run back to back in a fixed order would carry that drift into
            # their ratios.
            engine.speculator = None
            closed_loop(llm, workloads[workload](c, random.Random(-c)), c, params)
            # An adaptive arm measures its price at each load it meets first, then holds it for KEEP_STEPS steps or
            # until what measuring lost is repaid: a round holds far fewer decode steps than that at 16-32 streams,
            # so unwarmed rounds would charge it what a server pays once in hundreds of steps.
            for arm, spec in speculators.items():
                if spec is not None and spec.config.adaptive:
                    engine.speculator = spec
                    ran, lost = warm_up(llm, spec, lambda i: workloads[workload](c, random.Random(-c - 100 * i)), c,
                                        params, a.warm_steps)
                    repaid = "" if lost <= MEASURE_SHARE * ran else ", not repaid yet"
                    print(f"{workload:<6} C={c:<3} {arm:<15} warmed {ran} steps (measuring lost {lost:.1f} off "
                          f"steps: {100 * lost / max(ran, 1):.2f} per 100{repaid})", flush=True)
            totals = {arm: ArmTotals() for arm in speculators}
            names = list(speculators)
            for r in range(a.rounds):
                prompts = workloads[workload](n, random.Random(c + 1000 * r))
                for arm in names[r % len(names):] + names[:r % len(names)]:
                    spec = engine.speculator = speculators[arm]
                    st = spec.stats.copy() if spec else None
                    counted = replace(spec.policy.counters) if spec else None
                    t = totals[arm]
                    preempted = engine.scheduler.num_preemptions
                    started = time.perf_counter()
                    tok_s, tokens = closed_loop(llm, prompts, c, params, t.finished, t.decode_calls)
                    seconds = time.perf_counter() - started
                    t.seconds += seconds
                    t.generated += round(tok_s * seconds)
                    t.tokens += tokens
                    t.spoke = _sum_spoke(t.spoke, _spoke(st, spec.stats)) if spec else None
                    t.preempted += engine.scheduler.num_preemptions - preempted
                    if spec:
                        t.policy = _sum_counters(t.policy, counted, spec.policy.counters)
            off = totals["off"]
            for arm, t in totals.items():
                same = sum(x == o for x, o in zip(t.tokens, off.tokens)) / len(t.tokens)
                tok_s, preempted, spoke = t.generated / t.seconds, t.preempted, t.spoke
                ratio = tok_s / (off.generated / off.seconds)
                decode_ratio = t.decode_rate / off.decode_rate if off.decode_rate else 0.0
                tpot = _tpot_ms(t.finished)
                rows.append((workload, c, arm, tok_s, ratio, decode_ratio, tpot, spoke, same, preempted))
                print(f"{workload:<6} C={c:<3} {arm:<15} {tok_s:8.2f} tok/s  {ratio:5.2f}x  decode steps "
                      f"{decode_ratio:5.2f}x  TPOT {tpot:7.1f} ms  {_describe(spoke)}  same tokens: {same:.0%}  "
                      f"preemptions {preempted}  paused calls left out {len(t.decode_calls) - len(t.unpaused)}"
                      f"{_policy(t.policy)}", flush=True)
    print("\n| workload | concurrency | arm | tok/s | vs off | decode steps vs off | TPOT ms | proposed | accepted | "
          "acceptance | per position | K in effect | same tokens as off |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for workload, c, arm, tok_s, ratio, decode_ratio, tpot, spoke, same, _ in rows:
        drafted, accepted, drafts, per_position = spoke or (0, 0, 0, [])
        rate = f"{accepted / drafted:.0%}" if drafted else "—"
        positions = " / ".join(f"{n / drafts:.0%}" for n in per_position) if drafts else "—"
        k = f"{drafted / drafts:.1f}" if drafts else "—"
        print(f"| {workload} | {c} | {arm} | {tok_s:.2f} | {ratio:.2f}× | {decode_ratio:.2f}× | {tpot:.1f} | "
              f"{drafted:,} | {accepted:,} | {rate} | {positions} | {k} | {same:.0%} |")
    flags = " ".join(f"--{k.replace('_', '-')} {v!r}" for k, v in vars(a).items() if v is not None)
    print(f"\ncommand: python benchmarks/speculative.py {flags}")


@dataclass
class ArmTotals:
    """One arm's loops at one concurrency, summed over the rounds."""

    seconds: float = 0.0
    generated: int = 0
    decode_calls: list = field(default_factory=list)  # (seconds, tokens) of each engine call without a prompt chunk
    tokens: list = field(default_factory=list)  # each prompt's token ids, in order, round after round
    finished: list = field(default_factory=list)  # final outputs (their metrics time each request)
    spoke: tuple | None = None  # _spoke(): proposed, accepted, requests that verified, accepted per position
    preempted: int = 0
    policy: Counters | None = None  # what the arm's policy did in the rounds (adaptive arms)

    @property
    def unpaused(self) -> list[tuple[float, int]]:
        """The calls without a prompt chunk, less any over PAUSE times the median one: on a shared host a process
        stopped or starved for seconds, nothing an arm did (a burst is 8 steps at most)."""
        cap = PAUSE * statistics.median(s for s, _ in self.decode_calls) if self.decode_calls else 0.0
        return [(s, n) for s, n in self.decode_calls if s <= cap]

    @property
    def decode_rate(self) -> float:
        kept = self.unpaused
        return sum(n for _, n in kept) / sum(s for s, _ in kept) if kept else 0.0


def step_costs(engine, prompts: list[str], params: SamplingParams, k: int, method: dict, draft) -> None:
    """One stream at a time, the same prompts off and at each fixed K: the median step, the tokens a step gives,
    and time per token (steps with a prompt chunk, and the first after it (the draft's catch-up), left out). With a
    draft, the first of --draft-context and --draft-vocab."""
    for kk in range(k + 1):
        engine.speculator = None if kk == 0 else Speculator(SpeculativeConfig.parse(
            {**method, "num_speculative_tokens": kk, "adaptive": False}), engine.max_model_len, draft)
        seconds, tokens = [], 0
        for i, prompt in enumerate(prompts):
            engine.add_request(f"costs-{kk}-{i}", prompt, params)
            engine.step()  # the prompt
            engine.step()  # the draft's catch-up over it
            while engine.has_unfinished_requests():
                before, started = engine.snapshot().generated_tokens, time.perf_counter()
                engine.step()
                seconds.append(time.perf_counter() - started)
                tokens += engine.snapshot().generated_tokens - before
        print(f"K={kk}: {len(seconds)} steps, median {1000 * statistics.median(seconds):.1f} ms, "
              f"{tokens / len(seconds):.2f} tokens/step, {1000 * sum(seconds) / tokens:.1f} ms/token", flush=True)


def warm_up(llm: LLM, spec: Speculator, prompts, concurrency: int, params: SamplingParams,
            steps: int) -> tuple[int, float]:
    """Closed loops of new prompts (prompts(i): the i-th loop's) until the arm's policy has counted `steps` steps
    at this concurrency and what its measuring lost there is repaid (at most MEASURE_SHARE of them), as on a server
    that has run a while; gives up at 4 x `steps`. Returns the steps run and the off steps measuring lost in them."""
    start, i = replace(spec.policy.counters), 0
    while True:
        now = spec.policy.counters
        ran, lost = now.steps - start.steps, now.lost_off_steps - start.lost_off_steps
        if ran >= 4 * steps or (ran >= steps and lost <= MEASURE_SHARE * ran):
            return ran, lost
        closed_loop(llm, prompts(i), concurrency, params)
        i += 1


def _sum_counters(total: Counters | None, before: Counters, after: Counters) -> Counters:
    base = total or Counters()
    return Counters(*(t + y - x for t, x, y in zip(astuple(base), astuple(before), astuple(after))))


def _policy(c: Counters | None) -> str:
    """The policy's own count over the rounds: measuring's cost per 100 steps (the mechanism, not the clock)."""
    if c is None or not c.steps:
        return ""
    return (f"  policy: {c.steps} steps, {c.speculated / c.steps:.0%} speculating, {c.measuring} measuring, "
            f"lost {100 * c.lost_off_steps / c.steps:.2f} off steps per 100")


def _tpot_ms(finished: list) -> float:
    """Mean time per output token after the first, over requests (what speculation shortens for each stream)."""
    gaps = [(o.metrics.last_token_time - o.metrics.first_token_time) / (len(o.outputs[0].token_ids) - 1)
            for o in finished if len(o.outputs[0].token_ids) > 1]
    return 1000 * sum(gaps) / len(gaps) if gaps else 0.0


def _spoke(before, after) -> tuple[int, int, int, list[int]]:
    """(proposed, accepted, requests that verified proposals, accepted at each position) between two stats."""
    return (after.num_draft_tokens - before.num_draft_tokens, after.num_accepted_tokens - before.num_accepted_tokens,
            after.num_drafts - before.num_drafts,
            [x - y for x, y in zip(after.accepted_per_position, before.accepted_per_position)])


def _sum_spoke(a: tuple[int, int, int, list[int]] | None,
               b: tuple[int, int, int, list[int]]) -> tuple[int, int, int, list[int]]:
    if a is None:
        return b
    return a[0] + b[0], a[1] + b[1], a[2] + b[2], [x + y for x, y in zip(a[3], b[3])]


def _describe(spoke: tuple[int, int, int, list[int]] | None) -> str:
    if not spoke or not spoke[2]:
        return "proposed      0"
    drafted, accepted, drafts, per_position = spoke
    return (f"proposed {drafted:6d}  accepted {accepted:6d} ({accepted / drafted:.0%}; per position "
            f"{' '.join(f'{n / drafts:.0%}' for n in per_position)}; K {drafted / drafts:.1f})")


if __name__ == "__main__":
    main()
