"""A completions stream sends a chunk for every step that made tokens, text or not, as vLLM's completions do: a
stream's pace is the engine's (docs/benchmarks.md#latency-under-load)."""
from __future__ import annotations

from tally.outputs import CompletionOutput, RequestOutput
from tally.server.completions import Completions
from tally.server.lifecycle import Ctx


def _output(text: str, token_ids: list[int], finish_reason: str | None = None) -> RequestOutput:
    return RequestOutput("r0", "Hi", [1], None, [CompletionOutput(0, text, token_ids, finish_reason=finish_reason)],
                         finished=finish_reason is not None)


def test_a_step_whose_tokens_have_no_text_yet_still_sends_a_chunk():
    completions = Completions(tokenizer=None)
    ctx = Ctx("cmpl-1", 0, "m", completions.parse({"model": "m", "prompt": "Hi", "stream": True}), ["r0"])
    steps = [_output(" a", [5]),
             _output(" a", [5, 2]),  # a skipped special token (an ignored EOS) or half of a character
             _output(" a", [5, 2]),  # nothing new: no chunk
             _output(" a\u00e9", [5, 2, 7], "length")]
    sent = [[c["choices"][0]["text"] for c in completions.chunks(ctx, [out])] for out in steps]
    assert sent == [[" a"], [""], [], ["\u00e9"]]
