"""`--api-key`: bearer authentication on every route that touches the model: the OpenAI routes (`/v1/*`), as vLLM
does, and the tokenizer helpers (a long prompt costs seconds of tokenizing); /health, /metrics, /version and /ledger
stay open. The key may also come as `x-api-key`, the header Anthropic's clients send. A pure ASGI middleware (not
Starlette's BaseHTTPMiddleware, which wraps the receive channel that streaming responses and disconnect detection
read), comparing in constant time."""
from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")
ANTHROPIC_PREFIX = "/v1/messages"  # answers in Anthropic's error shape


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._bearer = f"Bearer {api_key}".encode()
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIXES):
            headers = dict(scope["headers"])
            bearer = hmac.compare_digest(headers.get(b"authorization", b""), self._bearer)
            if not (bearer | hmac.compare_digest(headers.get(b"x-api-key", b""), self._key)):
                await _unauthorized(send, scope["path"].startswith(ANTHROPIC_PREFIX))
                return
        await self.app(scope, receive, send)


async def _unauthorized(send: Send, anthropic: bool) -> None:
    message = ("missing or wrong API key; send the header 'Authorization: Bearer <key>' (or 'x-api-key: <key>') "
               "with the server's --api-key")
    error = {"type": "error", "error": {"type": "authentication_error", "message": message}} if anthropic else \
        {"error": {"message": message, "type": "authentication_error", "param": None, "code": 401}}
    body = json.dumps(error).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
    await send({"type": "http.response.body", "body": body})
