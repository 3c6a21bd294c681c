"""`--api-key`: bearer authentication on every route that touches the model: the OpenAI routes (`/v1/*`), as vLLM
does, and the tokenizer helpers (a long prompt costs seconds of tokenizing); /health, /metrics, /version and /ledger
stay open. A pure ASGI middleware (not Starlette's BaseHTTPMiddleware, which wraps the
receive channel that streaming responses and disconnect detection read), comparing in constant time."""
from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED_PREFIXES):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                await _unauthorized(send)
                return
        await self.app(scope, receive, send)


async def _unauthorized(send: Send) -> None:
    body = json.dumps({"error": {"message": "missing or wrong API key; send the header "
                                            "'Authorization: Bearer <key>' with the server's --api-key",
                                 "type": "authentication_error", "param": None, "code": 401}}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
    await send({"type": "http.response.body", "body": body})
