"""`tally serve --request-log DIR`: one JSON line per finished request — arrival time, prompt and output token
counts, finish reason, latencies — in files rotated by size, so real traffic drives planning (`tally plan
--lengths DIR`), load tests (`tally bench --replay DIR`) and calibration (`tally quantize --calib DIR`).

Prompt text is written only with --log-prompts, and then through a redaction hook (default `redact`: e-mail
addresses, long numbers and key-like strings; `--redact MODULE:FUNCTION` names another str -> str function).
"""
from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tally.errors import ConfigError
from tally.outputs import RequestOutput

FILE_PATTERN = "requests-{:06d}.jsonl"
# An e-mail address, `[\w.+-]+@[\w-]+(?:\.[\w-]+)+` as a pattern searched at every position would read a long run
# of name characters once from each of its positions. Here a name starts only where a run starts, and addresses
# written back to back (the next name beginning where a domain ends) are one match, read as they come.
_DOMAIN = r"@[\w-]++(?:\.[\w-]++)++"
_EMAIL = re.compile(rf"(?<![\w.+-])[\w.+-]++{_DOMAIN}(?:[\w.+-]++{_DOMAIN})*+")
# Linear as they are: a key's start fails within 31 characters, and at most five starts in a run of number
# characters can fail, each reading the run once.
_KEY = re.compile(r"\b(?:sk|pk|rk|api|key|token|secret)[-_][A-Za-z0-9_-]{8,}|\b[A-Za-z0-9+/_-]{32,}={0,2}")
_NUMBER = re.compile(r"\+?\d[\d ().-]{4,}\d")  # phone, card and account numbers, long ids
# Line breaks to str.splitlines() and to JavaScript that json.dumps(ensure_ascii=False) writes raw (it escapes the
# control characters below U+0020): escaped, every reader finds one record per line, and the file stays UTF-8 text.
_ESCAPE_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})
# The prompt text one request may log: redaction runs on the event loop and Python's regular expressions hold the
# GIL, so a prompt near the body limit (kept by truncate_prompt_tokens, or dropped by a template) would stall every
# request for seconds. A context's worth of text is far below it; the text's end is kept, as truncation keeps it.
LOGGED_TEXT_CHARS = 65_536


def redact(text: str) -> str:
    """E-mail addresses, key-like strings and long numbers replaced, in time linear in the text's length."""
    text = _EMAIL.sub("<email>", text)
    text = _KEY.sub("<key>", text)
    return _NUMBER.sub("<number>", text)


def redaction_hook(spec: str | None) -> Callable[[str], str]:
    """`MODULE:FUNCTION` -> that function; None -> `redact`."""
    if spec is None:
        return redact
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"--redact {spec!r}: cannot import it ({exc}); write MODULE:FUNCTION") from None


class RequestLog:
    def __init__(self, directory: Path, max_file_bytes: int = 64 * 2**20, log_prompts: bool = False,
                 redactor: Callable[[str], str] = redact) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_file_bytes = max_file_bytes
        self.log_prompts = log_prompts
        self.redactor = redactor
        existing = sorted(self.directory.glob("requests-*.jsonl"))
        self._index = int(existing[-1].stem.split("-")[1]) if existing else 1
        self._file = self._open()

    def _open(self):
        return open(self.directory / FILE_PATTERN.format(self._index), "a", encoding="utf-8")

    def write(self, endpoint: str, request: Any, arrival_unix_s: float, outputs: list[RequestOutput]) -> None:
        """One line per prompt of a finished HTTP request."""
        texts = self._prompts(request, len(outputs)) if self.log_prompts else [None] * len(outputs)
        for out, text in zip(outputs, texts):
            m = out.metrics
            record = {
                "arrival_time": arrival_unix_s, "endpoint": endpoint, "request_id": out.request_id,
                "prompt_tokens": len(out.prompt_token_ids),
                "output_tokens": sum(len(c.token_ids) for c in out.outputs), "n": len(out.outputs),
                "finish_reason": out.outputs[0].finish_reason, "cached_tokens": out.num_cached_tokens,
                "queue_s": m.queue_s if m else None, "ttft_s": m.ttft_s if m else None,
                "e2e_s": m.e2e_s if m else None,
            }
            if text is not None:
                record.update(text)
            self._file.write(json.dumps(record, ensure_ascii=False).translate(_ESCAPE_LINE_BREAKS) + "\n")
        self._file.flush()
        if self._file.tell() >= self.max_file_bytes:
            self._file.close()
            self._index += 1
            self._file = self._open()

    def _prompts(self, request: Any, count: int) -> list[dict | None]:
        budget = [LOGGED_TEXT_CHARS]
        messages = getattr(request, "messages", None)
        if messages is not None and all(hasattr(m, "text") for m in messages):  # chat's, not Anthropic's dicts
            texts = [self._clipped(m.text(), budget) for m in reversed(messages)][::-1]
            turns = [{"role": m.role, "content": text} for m, text in zip(messages, texts)]
            return [{"messages": turns}] * count
        prompt = getattr(request, "prompt", None)  # None: an API whose input is neither (messages, responses)
        if prompt is None:
            return [None] * count
        if isinstance(prompt, str):
            prompts = [prompt]
        elif prompt and all(isinstance(t, int) for t in prompt):
            prompts = [None]  # token ids: no text to log
        else:
            prompts = list(prompt)
        return [{"prompt": self._clipped(p, budget)} if isinstance(p, str) else None for p in prompts[:count]]

    def _clipped(self, text: str, budget: list[int]) -> str:
        """The text redacted, its end within what is left of the request's LOGGED_TEXT_CHARS."""
        keep = min(len(text), budget[0])
        budget[0] -= keep
        if keep == len(text):
            return self.redactor(text)
        return f"[{len(text) - keep:,} characters not logged]" + self.redactor(text[len(text) - keep:])

    def close(self) -> None:
        self._file.close()
