"""Answers from any OpenAI-compatible server (Tally, vLLM, llama.cpp, SGLang): a `prompt` item to /v1/completions, a
`messages` item to /v1/chat/completions, a batch's requests in flight together. A request the server refuses fails
its item; a server that cannot be reached stops the eval with an error that says so."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from tally.errors import ConfigError, clip
from tally.quality.answers import Answer, item_seed
from tally.quality.suite_file import SuiteItem

CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 600.0  # one item, generated whole: a long answer on a busy CPU server takes minutes


def is_url(model: str | None) -> bool:
    return bool(model) and model.startswith(("http://", "https://"))


def _root(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


class UrlAnswers:
    def __init__(self, url: str, model: str | None, batch_size: int) -> None:
        self.url = _root(url)
        key = os.environ.get("OPENAI_API_KEY")
        self.client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"} if key else {},
                                   timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
        self.batch_size = batch_size
        models = self._get_models()  # a server that is down or not there says so before any item runs
        self.model = model or self._first_model(models)

    def _get_models(self) -> httpx.Response:
        try:
            return self.client.get("/v1/models")
        except httpx.HTTPError as e:
            raise ConfigError(f"{self.url}: cannot reach an OpenAI-compatible server there ({type(e).__name__}: "
                              f"{e}); is it running, and is the URL right (http://HOST:PORT)?") from None

    def _first_model(self, response: httpx.Response) -> str:
        try:
            return response.raise_for_status().json()["data"][0]["id"]
        except (httpx.HTTPStatusError, ValueError, KeyError, IndexError, TypeError):
            raise ConfigError(f"{self.url}/v1/models answered {response.status_code} without a model list; name "
                              "the served model with --baseline-model / --candidate-model") from None

    def describe(self) -> dict[str, Any]:
        return {"kind": "url", "url": self.url, "model": self.model, "label": f"{self.model} at {self.url}"}

    def _request(self, item: SuiteItem) -> tuple[str, dict[str, Any]]:
        d = item.decoding
        body: dict[str, Any] = {"model": self.model, "max_tokens": d.max_tokens, "temperature": d.temperature,
                                "top_p": d.top_p}
        seed = item_seed(item)
        if seed is not None:
            body["seed"] = seed % (1 << 63)
        if item.prompt is not None:
            return "/v1/completions", {**body, "prompt": item.prompt}
        return "/v1/chat/completions", {**body, "messages": list(item.messages or ())}

    def _one(self, item: SuiteItem) -> Answer:
        path, body = self._request(item)
        try:
            response = self.client.post(path, json=body)
        except httpx.TimeoutException:
            return Answer("", None, f"no answer within {REQUEST_TIMEOUT_S:g} s")
        except httpx.TransportError as e:  # refused, reset, cut off: the server, not this item
            raise ConfigError(f"{self.url} stopped answering ({type(e).__name__}: {e})") from None
        if response.status_code != 200:
            return Answer("", None, f"{path} answered {response.status_code}: {clip(response.text, 300)}")
        try:
            data = response.json()
            choice = data["choices"][0]
            text = choice["text"] if item.prompt is not None else choice["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            return Answer("", None, f"{path} answered 200 without a choice: {clip(response.text, 300)}")
        tokens = (data.get("usage") or {}).get("completion_tokens")
        return Answer(text or "", tokens if isinstance(tokens, int) else None)

    def answer(self, items: list[SuiteItem]) -> list[Answer]:
        with ThreadPoolExecutor(min(self.batch_size, len(items))) as pool:
            return list(pool.map(self._one, items))
