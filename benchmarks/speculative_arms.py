"""The arms of benchmarks/speculative.py and one closed loop of each: on the offline engine (EngineArms: one engine,
each arm a Speculator swapped in) or on `tally serve` processes on loopback (ServerArms: one server an arm, up for
the whole run, driven by the official openai client). Both give a Run: what the loop measured, the same fields."""
from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, replace

import httpx
import openai
from closed_loop import closed_loop  # benchmarks/ is on sys.path when a script here runs

from tally import LLM, SamplingParams
from tally import metric_names as names
from tally.engine.speculation.policy import Counters
from tally.engine.speculation.speculator import Speculator
from tally.engine.speculation.stats import SpeculationStats
from tally.prometheus_text import Exposition, parse
from tally.server.process import ServerProcess

Prompt = str | list[dict]  # a completion's text, or a chat's messages
SERVED_NAME = "spec"  # every arm's server serves its model under this name


@dataclass
class Run:
    """One arm's closed loop."""

    seconds: float
    generated: int  # tokens generated
    outputs: list  # per prompt, in order: token ids (offline) or text (server), compared with off's
    tpot_s: list[float]  # per request of 2+ tokens: (last token - first) / (tokens - 1)
    decode_calls: list[tuple[float, int]]  # (seconds, tokens) of engine calls without a prompt chunk (a server:
    # one entry, their sums over the loop)
    spoke: tuple[int, int, int, list[int]] | None  # spoke(): what was proposed and accepted
    policy: Counters | None  # what the adaptive policy counted in the loop
    preempted: int = 0


def spoke(before: SpeculationStats, after: SpeculationStats) -> tuple[int, int, int, list[int]]:
    """(proposed, accepted, requests that verified proposals, accepted at each position) between two stats."""
    return (after.num_draft_tokens - before.num_draft_tokens, after.num_accepted_tokens - before.num_accepted_tokens,
            after.num_drafts - before.num_drafts,
            [x - y for x, y in zip(after.accepted_per_position, before.accepted_per_position)])


def counted_between(before: Counters, after: Counters) -> Counters:
    return Counters(*(y - x for x, y in zip(astuple(before), astuple(after))))


class EngineArms:
    """Every arm on one engine: each its own Speculator (None: off), swapped in for its loops, its adaptive policy
    kept from one loop to the next as a server's would be."""

    def __init__(self, llm: LLM, speculators: dict[str, Speculator | None]) -> None:
        self.llm, self.speculators = llm, speculators

    @property
    def names(self) -> list[str]:
        return list(self.speculators)

    def counters(self, arm: str) -> Counters | None:
        spec = self.speculators[arm]
        return replace(spec.policy.counters) if spec is not None and spec.config.adaptive else None

    def warm_shapes(self, prompts: list[Prompt], concurrency: int, max_tokens: int) -> None:
        """The first loop at a concurrency meets matmul shapes the CPU library has not compiled kernels for yet:
        one engine, so one loop (off) serves every arm."""
        self.loop("off", prompts, concurrency, max_tokens)

    def loop(self, arm: str, prompts: list[Prompt], concurrency: int, max_tokens: int) -> Run:
        engine = self.llm.engine
        spec = engine.speculator = self.speculators[arm]
        stats, counted, preempted = spec and spec.stats.copy(), self.counters(arm), engine.scheduler.num_preemptions
        finished, calls = [], []
        started = time.perf_counter()
        tok_s, tokens = closed_loop(self.llm, prompts, concurrency, SamplingParams(temperature=0.0,
                                                                                 max_tokens=max_tokens),
                                    finished, calls)
        seconds = time.perf_counter() - started
        tpot = [(o.metrics.last_token_time - o.metrics.first_token_time) / (len(o.outputs[0].token_ids) - 1)
                for o in finished if len(o.outputs[0].token_ids) > 1]
        return Run(seconds, round(tok_s * seconds), tokens, tpot, calls, spec and spoke(stats, spec.stats),
                   counted and counted_between(counted, self.counters(arm)),
                   engine.scheduler.num_preemptions - preempted)


@dataclass
class Answer:
    text: str = ""
    tokens: int = 0  # the usage the server reported
    first_s: float | None = None  # when the first and last pieces of text came
    last_s: float | None = None


@dataclass
class Scrape:
    """What a server's /metrics says of speculation, preemption and its decode steps."""

    stats: SpeculationStats | None
    policy: Counters | None
    preemptions: float
    decode: tuple[float, float]  # (seconds, tokens) in steps without a prompt chunk


class ServerArms:
    """Every arm its own `tally serve` on loopback, started with the arm's --speculative-config and up for the whole
    run, so each keeps its policy's state as a long-running server does (`with ServerArms(...)`)."""

    def __init__(self, configs: dict[str, dict | None], flags: list[str]) -> None:
        """`configs`: each arm's --speculative-config (None: off); `flags`: the rest of every server's."""
        self.servers = {arm: ServerProcess([*flags, "--served-model-name", SERVED_NAME,
                                            *(["--speculative-config", json.dumps(cfg)] if cfg else [])])
                        for arm, cfg in configs.items()}

    def __enter__(self) -> ServerArms:
        """Every server started at once (a start mostly waits on imports and the model's load), all healthy or all
        stopped."""
        with ThreadPoolExecutor(len(self.servers)) as pool:
            failed = [e for e in pool.map(_start, self.servers.values()) if e is not None]
        if failed:
            self.__exit__()
            raise failed[0]
        return self

    def __exit__(self, *exc) -> None:
        with ThreadPoolExecutor(len(self.servers)) as pool:
            list(pool.map(lambda server: server.__exit__(None, None, None), self.servers.values()))

    @property
    def names(self) -> list[str]:
        return list(self.servers)

    def scrape(self, arm: str) -> Scrape:
        e = parse(httpx.get(self.servers[arm].url + "/metrics", timeout=60).text)
        stats = None
        if names.SPEC_DECODE_NUM_DRAFTS in e.counters:
            per_position = sorted((int(labels["position"]), v) for labels, v in
                                  e.counters.get(names.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS, []))
            stats = SpeculationStats(*(int(_total(e, n)) for n in (
                names.SPEC_DECODE_NUM_DRAFTS, names.SPEC_DECODE_NUM_DRAFT_TOKENS,
                names.SPEC_DECODE_NUM_ACCEPTED_TOKENS)), [int(v) for _, v in per_position])
        policy = Counters(*(int(_total(e, n)) for n in (
            names.SPEC_DECODE_POLICY_STEPS, names.SPEC_DECODE_POLICY_MEASURING_STEPS,
            names.SPEC_DECODE_POLICY_SPECULATING_STEPS)), _total(e, names.SPEC_DECODE_POLICY_LOST_OFF_STEPS)) \
            if names.SPEC_DECODE_POLICY_STEPS in e.counters else None
        return Scrape(stats, policy, _total(e, names.NUM_PREEMPTIONS),
                      (_total(e, names.DECODE_STEP_SECONDS), _total(e, names.DECODE_STEP_TOKENS)))

    def counters(self, arm: str) -> Counters | None:
        return self.scrape(arm).policy

    def warm_shapes(self, prompts: list[Prompt], concurrency: int, max_tokens: int) -> None:
        """Each server compiles its own kernels for the shapes it meets first."""
        for arm in self.servers:
            self.loop(arm, prompts, concurrency, max_tokens)

    def loop(self, arm: str, prompts: list[Prompt], concurrency: int, max_tokens: int) -> Run:
        before = self.scrape(arm)
        started = time.perf_counter()
        answers = asyncio.run(_closed_loop(self.servers[arm], prompts, concurrency, max_tokens))
        seconds = time.perf_counter() - started
        after = self.scrape(arm)
        tpot = [(a.last_s - a.first_s) / (a.tokens - 1) for a in answers if a.tokens > 1 and a.first_s is not None]
        decode = tuple(y - x for x, y in zip(before.decode, after.decode))
        return Run(seconds, sum(a.tokens for a in answers), [a.text for a in answers], tpot,
                   [decode] if decode[0] > 0 else [], after.stats and spoke(before.stats, after.stats),
                   after.policy and counted_between(before.policy, after.policy),
                   round(after.preemptions - before.preemptions))


def _start(server: ServerProcess) -> Exception | None:
    try:
        server.start()
    except RuntimeError as e:  # ServerProcess.start: exited or not healthy, with its log
        return e
    return None


def _total(e: Exposition, name: str) -> float:
    """A counter's value, its label sets added up."""
    return sum(v for _, v in e.counters.get(name, []))


async def _closed_loop(server: ServerProcess, prompts: list[Prompt], concurrency: int,
                       max_tokens: int) -> list[Answer]:
    """C streams, each taking the next prompt when its request ends."""
    answers = [Answer() for _ in prompts]
    pending = iter(range(len(prompts)))
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=3600) as client:
        async def stream() -> None:
            for i in pending:
                await _ask(client, prompts[i], max_tokens, answers[i])
        await asyncio.gather(*(stream() for _ in range(concurrency)))
    return answers


async def _ask(client: openai.AsyncOpenAI, prompt: Prompt, max_tokens: int, answer: Answer) -> None:
    """Greedy, streamed: a completion for a text, a chat completion for messages."""
    kw = dict(model=SERVED_NAME, max_tokens=max_tokens, temperature=0, stream=True,
              stream_options={"include_usage": True})
    chat = not isinstance(prompt, str)
    chunks = await (client.chat.completions.create(messages=prompt, **kw) if chat else
                    client.completions.create(prompt=prompt, **kw))
    async for chunk in chunks:
        piece = (chunk.choices[0].delta.content if chat else chunk.choices[0].text) if chunk.choices else None
        if piece:
            answer.last_s = time.perf_counter()
            answer.first_s = answer.first_s or answer.last_s
            answer.text += piece
        if chunk.usage is not None:
            answer.tokens = chunk.usage.completion_tokens
