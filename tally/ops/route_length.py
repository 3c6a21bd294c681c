"""How many tokens a request needs, without a tokenizer in the router: the body's bytes bound the prompt's tokens
from above (byte-level BPE and SentencePiece with byte fallback spend at least one byte per token), so a request
whose bound is short is short at no cost; any other is counted exactly by one POST /tokenize to a replica."""
from __future__ import annotations

import json

import httpx

from tally.ops.route_pools import Need

# Tokens a chat template adds beyond the body's own bytes: role markers, BOS, a default system line.
TEMPLATE_SLACK_TOKENS = 64
MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")  # OpenAI's, Responses' and Anthropic's
COUNTED_PATHS = ("/v1/completions", "/v1/chat/completions")  # the bodies a Tally or vLLM /tokenize can count


def bound_need(body: bytes, path: str) -> tuple[Need, dict | None]:
    """The request's need as an upper bound (exact for token-id prompts), and the /tokenize body that would count
    its prompt exactly (None where the bound is exact or no /tokenize can count it)."""
    bound = len(body) + TEMPLATE_SLACK_TOKENS
    try:
        data = json.loads(body)
    except ValueError:
        return Need(bound, None, False), None
    if not isinstance(data, dict):
        return Need(bound, None, False), None
    max_tokens = next((v for k in MAX_TOKENS_FIELDS if isinstance(v := data.get(k), int) and not isinstance(v, bool)),
                      None)
    prompt, messages = data.get("prompt"), data.get("messages")
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):  # several token-id prompts
        return Need(max(len(p) for p in prompt), max_tokens, True), None
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):  # one token-id prompt
        return Need(len(prompt), max_tokens, True), None
    payload = None
    if path in COUNTED_PATHS:
        if isinstance(prompt, str):
            payload = {"prompt": prompt}
        elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            payload = {"prompt": prompt[0]}
        elif isinstance(messages, list) and not data.get("tools"):  # tools render into the prompt; /tokenize has none
            payload = {"messages": messages, "add_generation_prompt": data.get("add_generation_prompt", True)}
        if payload is not None and isinstance(data.get("model"), str):
            payload["model"] = data["model"]
    return Need(bound, max_tokens, False), payload


async def exact_need(client: httpx.AsyncClient, url: str, payload: dict, bound: Need,
                     timeout_s: float) -> Need | None:
    """The need with its prompt counted by `url`'s /tokenize; None when that replica cannot count it."""
    try:
        answer = await client.post(url + "/tokenize", json=payload, timeout=timeout_s)
        count = answer.json().get("count") if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return Need(count, bound.max_tokens, True) if isinstance(count, int) else None
