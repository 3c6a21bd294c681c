"""Loading a checkpoint shows its progress, as vLLM's "Loading safetensors checkpoint shards" bar:
out of a total the headers give before any weight is read; a bar on a terminal, a line per tenth of the way in a
log, nothing with use_tqdm_on_load=False (vLLM's flag) and nothing from the ranks after 0."""
from __future__ import annotations

from tally.engine.config import EngineConfig
from tally.engine.llm import LLM
from tally.models.gguf_header import read_header
from tally.models.loader import load_checkpoint
from tally.progress import on_stderr, untracked

SMALL = dict(dtype="float32", max_model_len=64, kv_cache_memory=4 * 2**20)


def loading_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("Loading ")]


def test_off_a_terminal_loading_reports_each_tenth_of_the_tensors(tiny_llama, capsys):
    total = len(dict(load_checkpoint(str(tiny_llama)).tensors()))
    capsys.readouterr()
    LLM(str(tiny_llama), **SMALL)
    lines = loading_lines(capsys.readouterr().err)
    counts = [int(line.rsplit(" ", 1)[1].split("/")[0]) for line in lines]
    assert lines[-1] == f"Loading safetensors tensors: {total}/{total}"
    assert 2 <= len(lines) <= 11 and counts == sorted(set(counts))  # tenths, in order, never past the total
    assert "\x1b[" not in capsys.readouterr().err


def test_on_a_terminal_loading_is_a_bar(tiny_llama, terminal, capsys):
    LLM(str(tiny_llama), **SMALL)
    err = capsys.readouterr().err
    assert "Loading safetensors tensors" in err and "100%" in err


def test_use_tqdm_on_load_false_loads_quietly(tiny_llama, terminal, capsys):
    LLM(str(tiny_llama), use_tqdm_on_load=False, **SMALL)
    assert "Loading" not in capsys.readouterr().err


def test_only_rank_0_shows_it():
    assert EngineConfig().load_progress() is on_stderr
    assert EngineConfig().load_progress(rank=1) is untracked
    assert EngineConfig(use_tqdm_on_load=False).load_progress() is untracked


def test_a_gguf_files_total_comes_from_its_header_before_any_tensor_is_dequantized():
    ckpt = load_checkpoint(None)  # the built-in GGUF
    seen: list[tuple[int, str]] = []

    def record(items, description):
        seen.append((len(items), description))
        return items

    next(ckpt.tensors(record))  # the first tensor only: the total is known before it is read
    assert seen == [(len(read_header(ckpt.path).tensors), "Loading GGUF tensors")]
