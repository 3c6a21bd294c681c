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

A closed loop per concurrency C: C requests in flight, each replaced when it finishes, --requests-per-slot x C
requests (at least --min-requests) a loop; tokens/s counts every generated token over the loops' whole time,
prompts' prefill included; TPOT is the mean time per output token after the first, per request (the prefill left
out: what speculation shortens). Per C, then per workload (a load's price serves every workload at it, as on a
server with a mix): after a warm-up loop, each adaptive arm runs loops of new prompts until its policy has counted
--warm-steps steps and what its measuring lost in them is repaid (a server that has run a while), or --warm-seconds
have passed (printed: "warmed for N steps / S seconds", and "not repaid yet" if so); then every arm runs --rounds
loops, each round over new prompts and with the arms' order rotated by one, so that drift in the machine's speed
falls on every arm alike; ratios are against `off`'s tokens/s over its rounds. "decode steps" is the same ratio over
the engine calls without a prompt chunk, less those of a paused process (over 20 times the median call): at 16-32
streams most of a run can be prompts' prefill, whose speed moves between arms by more than speculation's effect
(docs/benchmarks.md#speculative-decoding). The policy's own counts over the rounds follow each adaptive arm: its
steps, the share that verified proposals, its measuring steps, and what measuring lost in off steps per 100 steps
(the mechanism, not the clock). Prefix caching is off, so no arm reuses another's prompts.

Offline (the default), every arm runs on one engine (one copy of the weights; with --draft-model the draft's own
pool takes its share of --kv-cache-memory in every arm, so the arms have the same target pool): each arm is its own
Speculator, swapped in for its runs, its adaptive policy kept from one run to the next as a server's would be; the
engine runs bursts of plain decode steps. With --server, each arm is its own `tally serve` on loopback with the arm's --speculative-config, up
for the whole run, one engine step per call as a server runs; the openai client streams completions (chat: chat
completions, the server applying the template), "same tokens" compares their text, "decode steps" and the policy's
counts come from each server's /metrics (tally:decode_step_*, tally:spec_decode_policy_*).
Printed per arm: acceptance (accepted / proposed), the acceptance at each proposal position (proposals accepted
there / requests that verified proposals, vLLM's per-position rate), the mean proposals verified per speculating
request (K in effect), and preemptions (there should be none).

    python benchmarks/speculative.py [--concurrency 1,4,16,32] [--workloads quote,code,chat] [--k 6]
                                [--max-tokens N] (default: 256 tokens quoting, 96 otherwise)
                                [--model target.gguf --draft-model draft.gguf] [--arms "draft K fixed,..."]
                                [--rounds 3] [--fixed-k 2,3,4] (prompt lookup fixed at each K, beside adaptive)
                                [--draft-context 0,256] (draft_context_tokens: several give an arm of each)
                                [--draft-vocab 0,32768] (draft_vocab_size: the same) [--warm-steps 500]
                                [--warm-seconds 1800] [--server] [--aa]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import astuple, dataclass, field
from pathlib import Path

from speculative_arms import EngineArms, Run, ServerArms, counted_between  # benchmarks/ is on sys.path here

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


def chat_messages(n: int, rng: random.Random) -> list[list[dict]]:
    return [[{"role": "user", "content": rng.choice(CHAT_ASKS).format(rng.choice(CHAT_TOPICS))}] for _ in range(n)]


def chat_prompts(llm: LLM, n: int, rng: random.Random) -> list[str]:
    """chat_messages through the model's chat template, for the offline engine (a server applies it itself)."""
    tokenizer = llm.get_tokenizer()
    return [chat_prompt(tokenizer, messages, without_template=refuse_without_template, add_generation_prompt=True)
            for messages in chat_messages(n, rng)]


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
    p.add_argument("--warm-seconds", type=float, default=1800.0,
                   help="the longest an arm's warm-up at one concurrency runs before the rounds start unrepaid")
    p.add_argument("--server", action="store_true",
                   help="every arm its own `tally serve` on loopback, up for the whole run, driven with the openai "
                        "client (streamed completions; chat completions for chat) instead of the offline engine")
    p.add_argument("--aa", action="store_true",
                   help="adds an arm \"off again\": speculation off a second time (with --server, a second server), "
                        "whose ratio to off is the run's own noise")
    p.add_argument("--step-costs", action="store_true",
                   help="instead: one stream, what a step costs off and at each fixed K up to --k (the first "
                        "workload, the draft model if given, else prompt lookup)")
    a = p.parse_args()
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
    if a.aa:
        arms["off again"] = None
    arms = {arm: None if cfg is None else {"num_speculative_tokens": a.k, **cfg} for arm, cfg in arms.items()}
    configs = {arm: None if cfg is None else SpeculativeConfig.parse(cfg) for arm, cfg in arms.items()}
    workloads = {"quote": lambda n, rng: quote_prompts(n, rng, a.passage_chars),
                 "code": lambda n, rng: code_prompts(n, rng, a.context_lines)}
    if a.server:
        flags = [*([a.model] if a.model else []), "--max-model-len", "2048", "--kv-cache-memory",
                 str(a.kv_cache_memory), "--dtype", a.dtype, "--no-enable-prefix-caching", "--log-level", "warning"]
        with ServerArms(arms, flags) as runs:
            measure(a, runs, {**workloads, "chat": chat_messages})
        return
    loaded = next((c for c in configs.values() if c is not None and c.model is not None), None)
    llm = LLM(a.model, max_model_len=2048, kv_cache_memory=a.kv_cache_memory, dtype=a.dtype,
              enable_prefix_caching=False, speculative_config=loaded and {"model": loaded.model,
                                                                          "num_speculative_tokens": a.k})
    engine = llm.engine
    draft = engine.speculator.draft if engine.speculator is not None else None
    speculators = {arm: None if c is None else Speculator(c, engine.max_model_len, DraftProposer(
        draft.draft, draft.block_size, c.draft_context_tokens, c.draft_vocab_size) if c.model else None)
                   for arm, c in configs.items()}
    workloads["chat"] = lambda n, rng: chat_prompts(llm, n, rng)
    if a.step_costs:
        method = {"model": a.draft_model} if draft is not None else {"method": "ngram"}
        proposer = DraftProposer(draft.draft, draft.block_size, windows[0], vocabs[0]) if draft is not None else None
        first = a.workloads.split(",")[0]
        step_costs(engine, workloads[first](a.min_requests, random.Random(1)),
                   SamplingParams(temperature=0.0, max_tokens=a.max_tokens or ANSWER_TOKENS.get(first, 96)), a.k,
                   method, proposer)
        return
    measure(a, EngineArms(llm, speculators), workloads)


def measure(a: argparse.Namespace, runs: EngineArms | ServerArms, workloads: dict) -> None:
    """Per concurrency, then per workload: the arms' rounds, a line each as they end, and the table at the end. The
    concurrency is the outer loop as a server's load would be: a load's measuring, once repaid, serves every
    workload at it."""
    rows = []
    for c in (int(x) for x in a.concurrency.split(",")):
        n = max(a.min_requests, a.requests_per_slot * c)
        for workload in a.workloads.split(","):
            max_tokens = a.max_tokens or ANSWER_TOKENS.get(workload, 96)
            # A warm-up loop first (discarded): the first arm at a new concurrency meets matmul shapes (row counts)
            # the CPU library has not compiled kernels for yet, and the arms after it would gain from that alone.
            # Then --rounds rounds, each over prompts of its own with the arms in an order rotated by one: a VM's
            # speed drifts within minutes, and arms run back to back in a fixed order would carry that drift into
            # their ratios.
            runs.warm_shapes(workloads[workload](c, random.Random(-c)), c, max_tokens)
            # An adaptive arm measures its price at each load it meets first, then holds it for KEEP_STEPS steps or
            # until what measuring lost is repaid: a round holds far fewer decode steps than that at 16-32 streams,
            # so unwarmed rounds would charge it what a server pays once in hundreds of steps.
            for arm in runs.names:
                if runs.counters(arm) is not None:
                    ran, lost, seconds = warm_up(runs, arm, lambda i: workloads[workload](
                        n, random.Random(-c - 100 * i)), c, max_tokens, a.warm_steps, a.warm_seconds)
                    repaid = "" if lost <= MEASURE_SHARE * ran else ", not repaid yet"
                    print(f"{workload:<6} C={c:<3} {arm:<15} warmed for {ran} steps / {seconds:.0f} seconds "
                          f"(measuring lost {lost:.1f} off steps: {100 * lost / max(ran, 1):.2f} per 100{repaid})",
                          flush=True)
            totals = {arm: ArmTotals() for arm in runs.names}
            names = runs.names
            for r in range(a.rounds):
                prompts = workloads[workload](n, random.Random(c + 1000 * r))
                for arm in names[r % len(names):] + names[:r % len(names)]:
                    totals[arm].add(runs.loop(arm, prompts, c, max_tokens))
            off = totals["off"]
            for arm, t in totals.items():
                same = sum(x == o for x, o in zip(t.outputs, off.outputs)) / len(t.outputs)
                tok_s, preempted, spoke = t.generated / t.seconds, t.preempted, t.spoke
                ratio = tok_s / (off.generated / off.seconds)
                decode_ratio = t.decode_rate / off.decode_rate if off.decode_rate else 0.0
                tpot = 1000 * statistics.fmean(t.tpot_s) if t.tpot_s else 0.0
                rows.append((workload, c, arm, tok_s, ratio, decode_ratio, tpot, spoke, same, preempted))
                print(f"{workload:<6} C={c:<3} {arm:<15} {tok_s:8.2f} tok/s  {ratio:5.2f}x  decode steps "
                      f"{decode_ratio:5.2f}x  TPOT {tpot:7.1f} ms  {_describe(spoke)}  same tokens: {same:.0%}  "
                      f"preemptions {preempted}  paused calls left out {len(t.decode_calls) - len(t.unpaused)}"
                      f"{_policy(t.policy)}", flush=True)
    print("\n| workload | concurrency | arm | tok/s | vs off | decode steps vs off | TPOT ms | proposed | accepted | "
          "acceptance | per position | K in effect | same tokens as off |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    order = a.workloads.split(",")
    for workload, c, arm, tok_s, ratio, decode_ratio, tpot, spoke, same, _ in sorted(
            rows, key=lambda row: (order.index(row[0]), row[1])):
        drafted, accepted, drafts, per_position = spoke or (0, 0, 0, [])
        rate = f"{accepted / drafted:.0%}" if drafted else "—"
        positions = " / ".join(f"{n / drafts:.0%}" for n in per_position) if drafts else "—"
        k = f"{drafted / drafts:.1f}" if drafts else "—"
        print(f"| {workload} | {c} | {arm} | {tok_s:.2f} | {ratio:.2f}× | {decode_ratio:.2f}× | {tpot:.1f} | "
              f"{drafted:,} | {accepted:,} | {rate} | {positions} | {k} | {same:.0%} |")
    flags = " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {v!r}") for k, v in vars(a).items()
                     if v is not None and v is not False)
    print(f"\ncommand: python benchmarks/speculative.py {flags}")


@dataclass
class ArmTotals:
    """One arm's loops at one concurrency, summed over the rounds."""

    seconds: float = 0.0
    generated: int = 0
    decode_calls: list = field(default_factory=list)  # (seconds, tokens) of each engine call without a prompt chunk
    outputs: list = field(default_factory=list)  # each prompt's tokens (a server: text), round after round
    tpot_s: list = field(default_factory=list)  # each request's time per output token after the first
    spoke: tuple | None = None  # spoke(): proposed, accepted, requests that verified, accepted per position
    preempted: int = 0
    policy: Counters | None = None  # what the arm's policy did in the rounds (adaptive arms)

    def add(self, run: Run) -> None:
        self.seconds += run.seconds
        self.generated += run.generated
        self.decode_calls += run.decode_calls
        self.outputs += run.outputs
        self.tpot_s += run.tpot_s
        self.spoke = run.spoke and _sum_spoke(self.spoke, run.spoke)
        self.preempted += run.preempted
        self.policy = run.policy and Counters(*(x + y for x, y in zip(astuple(self.policy or Counters()),
                                                                      astuple(run.policy))))

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


def warm_up(runs: EngineArms | ServerArms, arm: str, prompts, concurrency: int, max_tokens: int, steps: int,
            limit_s: float) -> tuple[int, float, float]:
    """Closed loops of new prompts (prompts(i): the i-th loop's) until the arm's policy has counted `steps` steps
    at this concurrency and what its measuring lost there is repaid (at most MEASURE_SHARE of them), as on a server
    that has run a while, or `limit_s` has passed. Returns the steps run, the off steps measuring lost in them and
    the seconds it took."""
    start, started, i = runs.counters(arm), time.perf_counter(), 0
    while True:
        now = counted_between(start, runs.counters(arm))
        seconds = time.perf_counter() - started
        if seconds >= limit_s or (now.steps >= steps and now.lost_off_steps <= MEASURE_SHARE * now.steps):
            return now.steps, now.lost_off_steps, seconds
        runs.loop(arm, prompts(i), concurrency, max_tokens)
        i += 1


def _policy(c: Counters | None) -> str:
    """The policy's own count over the rounds: measuring's cost per 100 steps (the mechanism, not the clock)."""
    if c is None or not c.steps:
        return ""
    return (f"  policy: {c.steps} steps, {c.speculated / c.steps:.0%} speculating, {c.measuring} measuring, "
            f"lost {100 * c.lost_off_steps / c.steps:.2f} off steps per 100")


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
