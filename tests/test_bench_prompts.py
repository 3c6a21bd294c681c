"""Prompts are real text cut to the exact token count, by the server's /tokenize or a local
tokenizer.json, with an identical system prompt in front of the requests that share it."""
from __future__ import annotations

import asyncio
import random

import pytest
from support.bench_servers import serve

from tally.bench.feed import PromptFeed, PromptPreparationError
from tally.bench.length_samplers import FixedLengths
from tally.bench.prompts import CORPUS_PATH, PromptBuilder
from tally.bench.tokenizer import ApproxTokenizer, LocalTokenizer, server_tokenizer
from tally.bench.wire import ConnectionPool
from tally.bench.workload import RequestPlanner, WorkloadConfig


@pytest.fixture(scope="module")
def bpe_tokenizer_json(tmp_path_factory):
    """A real byte-level BPE with a BOS post-processor: merges make cut points shift counts."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS_PATH.read_text()[:60_000]], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 0)])
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def _items(n: int, shared_every: int = 2) -> list[tuple[int, int, bool]]:
    rng = random.Random(0)
    return [(rng.randint(1, 1500), rng.randint(0, 10**7), i % shared_every == 0) for i in range(n)]


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """The first 40 kB of the shipped corpus: tokenizing all of it takes seconds per tokenizer."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(CORPUS_PATH.read_text()[:40_000])
    return path


async def _check_exact(tokenizer, n: int, corpus=CORPUS_PATH) -> None:
    builder = await PromptBuilder.create(tokenizer, corpus)
    await builder.set_system_prompt(64)
    assert builder.system_tokens == 64
    items = _items(n)
    prompts = await asyncio.gather(*(builder.build(*item) for item in items))
    text = corpus.read_text()
    for (tokens, _, shared), prompt in zip(items, prompts):
        want = tokens + (64 if shared else 0)
        assert prompt.tokens == want
        assert len(await tokenizer.encode(prompt.text)) == want
        if shared:
            assert prompt.system_text == builder.system_text
            assert prompt.text.startswith(builder.system_text)
        assert prompt.user_text[:40].strip() in text  # real text, not filler
    assert builder.inexact_prompts == 0


def test_prompts_have_exact_token_counts_with_a_local_bpe_tokenizer(bpe_tokenizer_json,
                                                                    small_corpus):
    asyncio.run(_check_exact(LocalTokenizer(bpe_tokenizer_json), 100, small_corpus))


def test_prompts_have_exact_token_counts_with_the_server_tokenize_endpoint(small_corpus):
    async def main(url: str) -> None:
        pool = ConnectionPool(url)
        tokenizer = await server_tokenizer(pool, "fake-model")
        assert tokenizer is not None and tokenizer.exact
        await _check_exact(tokenizer, 40, small_corpus)
        pool.close()

    with serve() as server:
        asyncio.run(main(server.url))


def test_server_without_tokenize_is_detected():
    async def main() -> None:
        pool = ConnectionPool("http://127.0.0.1:9")  # nothing listens on the discard port
        assert await server_tokenizer(pool, "m") is None

    asyncio.run(main())


def test_approximate_tokenizer_is_labelled_inexact(small_corpus):
    tokenizer = ApproxTokenizer()
    assert not tokenizer.exact and "approx" in tokenizer.source
    asyncio.run(_check_exact(tokenizer, 20, small_corpus))


def _planned(n: int) -> list:
    planner = RequestPlanner(WorkloadConfig(FixedLengths(20, 4), None, concurrency=1,
                                            max_requests=n))
    return [planner.request(i, "") for i in range(n)]


def test_feed_builds_prompts_ahead_in_order_with_a_bounded_lead(small_corpus):
    async def main() -> None:
        builder = await PromptBuilder.create(ApproxTokenizer(), small_corpus)
        feed = PromptFeed(builder, _planned(50), ahead=8)
        await feed.start(ready=5)
        await asyncio.sleep(0.05)
        assert len(feed._futures) <= 8  # never more than `ahead` prompts held
        prompts = [await feed.get(i) for i in range(50)]
        assert all(p.tokens == 20 for p in prompts)
        await feed.close()
        short = PromptFeed(builder, _planned(3))
        await short.start(ready=10)  # fewer requests than asked for: returns, no hang
        assert [(await short.get(i)).tokens for i in range(3)] == [20, 20, 20]
        await short.close()

    asyncio.run(main())


def test_feed_reports_a_failed_prompt_build_before_the_run_starts(small_corpus):
    class BrokenTokenizer(ApproxTokenizer):
        async def decode(self, ids):
            raise ConnectionError("tokenizer went away")

    async def main() -> None:
        builder = await PromptBuilder.create(BrokenTokenizer(), small_corpus)
        feed = PromptFeed(builder, _planned(4))
        with pytest.raises(PromptPreparationError, match="request 0"):
            await feed.start(ready=4)
        await feed.close()

    asyncio.run(main())
