"""The disk prefix tier: a prompt prefix one engine computed is read back by the next one over the same folder (in
the same process, and across a real `tally serve` restart), with the outputs of computing it; another model, KV dtype
or block size never reads it; a damaged or torn file is a miss, not a crash or a wrong block; the folder stays within
its cap, least recently used blocks going first; /metrics and /ledger report the tier."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import httpx
import openai
import pytest
from support.engine_checks import assert_no_block_leak
from support.ledger_polling import idle, wait_for_ledger

from tally import LLM, SamplingParams
from tally.core.kv_tiers import extend_block_keys
from tally.core.request import Request
from tally.engine.kv_tiers.disk_prefix_cache import HEADER
from tally.errors import ConfigError
from tally.server.process import ServerProcess

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
BS = 4
ARGS = {"dtype": "float32", "kv_cache_memory": 4_000_000, "block_size": BS}


def _prompt(seed: int = 0, n: int = 90) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 300) for _ in range(n)]


def _run(model: Path, cache: Path, prompt: list[int], **more) -> tuple[list[int], LLM]:
    """One engine over the folder, one request; the engine is shut down (its blocks written) before returning."""
    llm = LLM(str(model), kv_disk_cache_dir=str(cache), **{**ARGS, **more})
    tokens = llm.generate({"prompt_token_ids": prompt}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    llm.engine.shutdown()
    assert_no_block_leak(llm)
    return tokens, llm


def _hits(llm: LLM) -> int:
    return llm.engine.snapshot().disk_cache.hit_tokens


@pytest.fixture(scope="module")
def cold(tiny_llama) -> list[int]:
    """The prompt's greedy tokens computed from scratch, no tier."""
    llm = LLM(str(tiny_llama), **ARGS)
    return llm.generate({"prompt_token_ids": _prompt()}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_a_restarted_engine_reads_the_prefix_back_with_the_same_outputs(tiny_llama, cold, tmp_path):
    first, a = _run(tiny_llama, tmp_path, _prompt())
    assert first == cold and _hits(a) == 0 and a.engine.snapshot().disk_cache.written_blocks > 0
    second, b = _run(tiny_llama, tmp_path, _prompt())
    full_blocks = (len(_prompt()) - 1) // BS  # the last prompt token is always computed: its logits are needed
    assert second == cold and _hits(b) == full_blocks * BS
    assert b.engine.snapshot().prefix_hit_tokens == full_blocks * BS
    # a prompt that shares only the first half of the blocks reads those and computes the rest
    shared = _prompt()[:40] + _prompt(seed=1, n=30)
    third, c = _run(tiny_llama, tmp_path, shared)
    assert _hits(c) == 40 and third == LLM(str(tiny_llama), **ARGS).generate(
        {"prompt_token_ids": shared}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.parametrize("change", ["another model", "int8 KV", "block size 8"])
def test_blocks_of_another_model_or_layout_are_never_read(tiny_llama, tiny_model_factory, tmp_path, change):
    _run(tiny_llama, tmp_path, _prompt())
    model, more = {"another model": (tiny_model_factory("qwen2"), {}),
                   "int8 KV": (tiny_llama, {"kv_cache_dtype": "int8"}),
                   "block size 8": (tiny_llama, {"block_size": 8})}[change]
    _, other = _run(model, tmp_path, _prompt(), **more)
    assert _hits(other) == 0 and other.engine.snapshot().disk_cache.queried_tokens > 0


def _file_of_block(llm: LLM, prompt: list[int], index: int) -> Path:
    keys = extend_block_keys(Request("r", prompt, 1, 0.0), BS, index + 1)
    return llm.engine.kv_tiers.disk.dir / (keys[index].hex() + ".kv")


def _flip_a_payload_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[HEADER.size + 100] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [
    _flip_a_payload_byte,
    lambda p: p.write_bytes(p.read_bytes()[:-7]),  # torn
    lambda p: p.write_bytes(b""),
    lambda p: p.write_bytes(b"not a KV block" * 200),
], ids=["flipped-byte", "torn", "empty", "garbage"])
def test_a_damaged_file_is_a_miss_from_that_block_on(tiny_llama, cold, tmp_path, damage):
    _, a = _run(tiny_llama, tmp_path, _prompt())
    path = _file_of_block(a, _prompt(), 5)
    damage(path)
    tokens, b = _run(tiny_llama, tmp_path, _prompt())
    assert tokens == cold and _hits(b) == 5 * BS
    assert b.engine.snapshot().disk_cache.damaged_files == 1
    # the damaged file was deleted, then written again from the recomputed block: the next engine reads it all
    tokens, c = _run(tiny_llama, tmp_path, _prompt())
    assert tokens == cold and _hits(c) == (len(_prompt()) - 1) // BS * BS


def test_the_folder_stays_within_its_cap_least_recently_used_first(tiny_llama, tmp_path):
    _, a = _run(tiny_llama, tmp_path, _prompt(seed=0))
    per_block = a.engine.snapshot().disk_cache.held_bytes // a.engine.snapshot().disk_cache.num_files
    cap = 40 * per_block  # two prompts' blocks do not fit
    _, b = _run(tiny_llama, tmp_path, _prompt(seed=0), kv_disk_cache_size=cap / 2**30)  # hits: recently used now
    assert _hits(b) > 0
    _, c = _run(tiny_llama, tmp_path, _prompt(seed=2), kv_disk_cache_size=cap / 2**30)
    disk = c.engine.snapshot().disk_cache
    files = [p for p in c.engine.kv_tiers.disk.dir.iterdir() if p.suffix == ".kv"]
    assert disk.held_bytes <= cap and disk.held_bytes == sum(p.stat().st_size for p in files)
    assert not any(p.name.endswith(".tmp") for p in c.engine.kv_tiers.disk.dir.iterdir())
    # The newest prompt's blocks are all there. Of the older one's 22 (its prompt's: generated tokens' blocks are not
    # cached), 4 went, from the tail (a hit stamps a run tail first): its first 18 blocks are left.
    _, d = _run(tiny_llama, tmp_path, _prompt(seed=2), kv_disk_cache_size=cap / 2**30)
    assert _hits(d) == (len(_prompt()) - 1) // BS * BS
    _, e = _run(tiny_llama, tmp_path, _prompt(seed=0), kv_disk_cache_size=cap / 2**30)
    assert _hits(e) == 18 * BS


def test_a_restarted_server_reads_a_long_system_prompt_from_disk(tiny_llama, tmp_path):
    """`tally serve` on loopback, stopped (SIGTERM: its queued blocks are written) and started again."""
    system = "In a paged KV cache, blocks of tokens are shared between requests with a common prefix. " * 4
    args = [str(tiny_llama), "--served-model-name", "tiny", "--dtype", "float32", "--kv-cache-memory", "8MB",
            "--block-size", str(BS), "--kv-disk-cache-dir", str(tmp_path), "--log-level", "warning"]

    def ask(server: ServerProcess) -> str:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)
        out = client.chat.completions.create(model="tiny", temperature=0, max_tokens=8, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": "Paris?"}])
        return out.choices[0].message.content

    with ServerProcess(args) as server:
        first = ask(server)
        led = wait_for_ledger(server, lambda led: idle(led) and led["disk_prefix_cache"]["written_blocks"] > 0)
        assert led["disk_prefix_cache"]["hit_tokens"] == 0 and led["disk_prefix_cache"]["written_blocks"] > 0
    assert any(f.suffix == ".kv" for d in tmp_path.iterdir() for f in d.iterdir())
    with ServerProcess(args) as server:
        assert ask(server) == first
        led = httpx.get(server.url + "/ledger", timeout=30).json()
        assert led["disk_prefix_cache"]["hit_tokens"] > 0
        assert led["plan"]["kv_tiers"]["disk_prefix_cache"]["files_at_start"] > 0
        assert led["swap_space"]["capacity_bytes"] == 4 * 2**30 and led["swap_space"]["held_bytes"] == 0
        metrics = httpx.get(server.url + "/metrics", timeout=30).text
    hits = [line for line in metrics.splitlines() if line.startswith("tally:external_prefix_cache_hits_total")]
    assert hits and float(hits[0].split()[-1]) == led["disk_prefix_cache"]["hit_tokens"]
    assert "tally:kv_disk_cache_bytes" in metrics and "tally:num_requests_swapped" in metrics


def test_a_folder_gone_under_a_running_engine_costs_only_misses(tiny_llama, cold, tmp_path):
    llm = LLM(str(tiny_llama), kv_disk_cache_dir=str(tmp_path), **ARGS)
    shutil.rmtree(llm.engine.kv_tiers.disk.dir)
    tokens = llm.generate({"prompt_token_ids": _prompt()}, GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    llm.engine.shutdown()
    assert tokens == cold and llm.engine.snapshot().disk_cache.write_errors > 0
    _, again = _run(tiny_llama, tmp_path, _prompt())  # the next engine makes the folder again
    assert again.engine.snapshot().disk_cache.written_blocks > 0


def test_a_folder_that_cannot_be_made_is_refused_at_start(tiny_llama, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="kv_disk_cache_dir"):
        LLM(str(tiny_llama), kv_disk_cache_dir=str(tmp_path / "file"), **ARGS)
