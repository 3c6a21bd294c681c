"""The code scorer: the model's Python, then the item's tests, run in the sandbox (tally/quality/sandbox.py); the
answer passes when the program exits 0 within its time and memory limits."""
from __future__ import annotations

import re
from dataclasses import dataclass

from tally.quality.sandbox import Limits, run_python
from tally.quality.scorer_params import ItemScore, Params

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
MAX_TIMEOUT_S = 300.0
MAX_MEMORY_MB = 16384


def code_of(answer: str) -> str:
    """The first ``` fenced block of the answer (an unclosed one runs to the end), else the whole answer."""
    fence = _FENCE.search(answer)
    return fence.group(1) if fence else answer


@dataclass(frozen=True)
class Code:
    """`tests`: Python run after the model's code (asserts, or a call of a check function). `with_prompt: true`
    puts a `prompt` item's text before the answer, for completion-style items whose prompt opens the function."""

    tests: str
    with_prompt: bool
    limits: Limits

    @classmethod
    def parse(cls, p: Params) -> Code:
        tests = p.text("tests")
        try:
            compile(tests, "tests", "exec")
        except SyntaxError as e:
            p.fail("tests", f"is not valid Python: {e.msg} (line {e.lineno})")
        limits = Limits(p.number("timeout_s", Limits.timeout_s, minimum=0.1, maximum=MAX_TIMEOUT_S),
                        int(p.number("memory_mb", Limits.memory_mb, minimum=64, maximum=MAX_MEMORY_MB)))
        return cls(tests, p.boolean("with_prompt", False), limits)

    def score(self, answer: str, prompt: str | None) -> ItemScore:
        code = (prompt or "") + answer if self.with_prompt else code_of(answer)
        result = run_python(f"{code}\n\n{self.tests}\n", self.limits)
        return ItemScore(1.0) if result.passed else ItemScore(0.0, reason=result.reason)
