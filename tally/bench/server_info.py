"""What the bench learns about a server before the run: that it answers, its model and context
window, and whether it accepts `ignore_eos` (without it, output lengths are only upper bounds)."""
from __future__ import annotations

from dataclasses import dataclass

import httpx

from tally.bench.client import PATHS
from tally.errors import ConfigError


@dataclass
class ServerInfo:
    url: str
    model: str
    endpoint: str
    max_model_len: int | None
    ignore_eos: bool
    models: list[str]
    probe_status: int  # HTTP status of the 1-token test request (not 200: ignore_eos unverified)


async def _models(http: httpx.AsyncClient, url: str) -> tuple[list[str], int | None]:
    try:
        response = await http.get(f"{url}/v1/models")
    except httpx.ConnectError as exc:
        raise ConfigError(f"no server answers at {url} ({exc}); start it or fix --url") from None
    if response.status_code != 200:
        return [], None
    data = response.json().get("data") or []
    lens = [m.get("max_model_len") for m in data if isinstance(m.get("max_model_len"), int)]
    return [str(m.get("id")) for m in data if m.get("id")], (lens[0] if lens else None)


async def _accepts(http: httpx.AsyncClient, url: str, endpoint: str, model: str,
                   ignore_eos: bool) -> httpx.Response:
    body: dict = {"model": model, "max_tokens": 1, "stream": False}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "Hello"}]
    else:
        body["prompt"] = "Hello"
    if ignore_eos:
        body["ignore_eos"] = True
    return await http.post(f"{url}{PATHS[endpoint]}", json=body)


async def probe_server(http: httpx.AsyncClient, url: str, endpoint: str,
                       model: str | None) -> ServerInfo:
    models, max_model_len = await _models(http, url)
    if model is None:
        if not models:
            raise ConfigError(f"{url}/v1/models lists no model; pass --model NAME")
        model = models[0]
    response = await _accepts(http, url, endpoint, model, ignore_eos=True)
    ignore_eos = response.status_code == 200
    if response.status_code in (400, 422):
        response = await _accepts(http, url, endpoint, model, ignore_eos=False)
    probe_status = response.status_code
    if 400 <= probe_status < 500 and probe_status != 429:
        raise ConfigError(f"a 1-token test request to {url}{PATHS[endpoint]} for model {model!r} "
                          f"got HTTP {probe_status}: {response.text[:300]}")
    if probe_status != 200:  # overloaded or failing: run anyway and count what happens
        ignore_eos = True
    return ServerInfo(url, model, endpoint, max_model_len, ignore_eos, models, probe_status)
