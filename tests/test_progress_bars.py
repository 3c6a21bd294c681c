"""Progress where work is long: `tally quantize` draws a bar with an ETA on a terminal and writes a line per tenth of
the way elsewhere; `tally eval` shows LLM.generate's bar, and none with --quiet. Off a terminal no bar is drawn."""
from __future__ import annotations

import pytest

from tally.engine.llm import LLM
from tally.progress import on_stderr
from tally.quality.model_run import ModelSpec, run_model
from tally.quality.settings import Decoding
from tally.quality.suites import Item, Workload
from tally.quantize.cli import main as quantize


def test_quantize_reports_its_layers_line_by_line_off_a_terminal(tiny_llama, tmp_path, capsys):
    assert quantize(["--model", str(tiny_llama), "--scheme", "w8a16", "--method", "rtn", "--out",
                     str(tmp_path / "q")]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("layers quantized (rtn")]
    assert lines and lines[-1].endswith(f": {len(lines)}/{len(lines)}")  # tiny model: one line per layer
    assert "\x1b[" not in err and "━" not in err  # no bar drawn into a log


def test_on_a_terminal_progress_is_a_bar_with_an_eta(terminal, capsys):
    assert list(on_stderr(range(5), "layers quantized")) == list(range(5))
    err = capsys.readouterr().err
    assert "layers quantized" in err and "100%" in err and "0:00:00" in err  # the time remaining column


@pytest.mark.parametrize("progress", [True, False])
def test_eval_shows_generates_bar_unless_quiet(tiny_llama, terminal, capsys, progress):
    llm = LLM(str(tiny_llama), dtype="float32", max_model_len=128, kv_cache_memory=4 * 2**20)
    ids = llm.get_tokenizer().encode("The quick brown fox")
    workload = Workload({}, [Item("json", str(i), ids) for i in range(3)], [])
    run = run_model(llm, ModelSpec(str(tiny_llama)), workload, Decoding(max_tokens=2), progress)
    assert len(run.generations) == 3
    assert ("Processed prompts" in capsys.readouterr().err) == progress
