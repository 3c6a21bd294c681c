"""What the proxy learns from one response while passing its bytes on untouched: when the first output came, how
many tokens and how fast, how each choice finished, whether it failed — for the canary's rules.

It reads copies: `feed` is handed each chunk after it was yielded to the client as is. An SSE stream is read event
by event; a JSON body is read once whole (up to MAX_JSON_BYTES); a compressed body is not read at all.
"""
from __future__ import annotations

import json

from tally.json_text import MAX_JSON_DEPTH, json_depth
from tally.ops.canary_rules import Sample

MAX_JSON_BYTES = 8 * 2**20  # a body past this goes through unread: its figures are unknown, not wrong


def _carries_output(choice: dict) -> bool:
    """Text, or any delta but the opening role-only one (content, tool calls, reasoning)."""
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and any(v for k, v in delta.items() if k != "role")


class ResponseMeter:
    def __init__(self, sent_s: float, status: int, content_type: str, content_encoding: str | None) -> None:
        self.sent_s, self.status = sent_s, status
        self.readable = content_encoding in (None, "", "identity")
        self.stream = content_type.startswith("text/event-stream")
        self.pending = b""  # a stream's unfinished line, or a JSON body so far
        self.first_output_s: float | None = None
        self.last_output_s: float | None = None
        self.output_events = 0
        self.usage_tokens: int | None = None
        self.finish_reasons: dict[int, str] = {}  # by choice index: a stream may repeat one
        self.error_event = False

    def feed(self, chunk: bytes, now_s: float) -> None:
        if not self.readable:
            return
        if not self.stream:
            if len(self.pending) + len(chunk) > MAX_JSON_BYTES:
                self.readable, self.pending = False, b""
            else:
                self.pending += chunk
            return
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                event = self._json(line[5:])
                if event is not None:
                    self._event(event, now_s)

    @staticmethod
    def _json(data: bytes) -> dict | None:
        if json_depth(data) > MAX_JSON_DEPTH:  # the parser recurses: a replica's odd body must not break the proxy
            return None
        try:
            event = json.loads(data)
        except ValueError:
            return None
        return event if isinstance(event, dict) else None

    def _event(self, event: dict, now_s: float | None) -> None:
        if "error" in event and self.stream:  # a JSON body's error goes with its status: a 400 is the client's
            self.error_event = True
        choices = event.get("choices") if isinstance(event.get("choices"), list) else []
        choices = [c for c in choices if isinstance(c, dict)]
        # A choice that finishes without text (a skipped special token) still ends its output at this event.
        if now_s is not None and any(_carries_output(c) or c.get("finish_reason") for c in choices):
            self.first_output_s = self.first_output_s if self.first_output_s is not None else now_s
            self.last_output_s = now_s
            self.output_events += sum(_carries_output(c) for c in choices)
        for c in choices:
            if isinstance(c.get("finish_reason"), str):
                self.finish_reasons[c.get("index", 0)] = c["finish_reason"]
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]

    def sample(self, end_s: float, broken: bool) -> Sample:
        """The response as one Sample; `broken`: the upstream failed before its end."""
        if self.readable and not self.stream and self.pending:
            body = self._json(self.pending)
            if body is not None:
                self._event(body, None)
        if broken or self.error_event or self.status >= 500 or self.status == 429:
            return Sample(end_s, error=True)
        tokens = self.usage_tokens if self.usage_tokens is not None else (
            self.output_events if self.stream and self.first_output_s is not None else None)
        ttft_s = tpot_s = None
        if self.first_output_s is not None:
            ttft_s = self.first_output_s - self.sent_s
            if tokens is not None and tokens >= 2:
                tpot_s = (self.last_output_s - self.first_output_s) / (tokens - 1)
        return Sample(end_s, False, ttft_s, tpot_s, tokens, tuple(self.finish_reasons.values()))
