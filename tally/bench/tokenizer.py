"""Token counting for prompt construction: the server's own tokenizer (`/tokenize` and
`/detokenize`, vLLM or llama.cpp shape) when it has one, else a local `tokenizer.json`, else a
word-level approximation that is labelled as such in every report."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tally.bench.wire import ConnectionPool
from tally.errors import ConfigError


class Tokenizer(Protocol):
    source: str  # shown in reports: where token counts come from
    exact: bool  # False when counts only approximate the server's

    async def encode(self, text: str) -> list[int]: ...

    async def decode(self, ids: list[int]) -> str: ...


class TokenizeError(Exception):
    """The server's /tokenize or /detokenize did not answer as expected."""


@dataclass
class ServerTokenizer:
    pool: ConnectionPool
    model: str
    llama_cpp_shape: bool = False  # {"content": ...} instead of vLLM's {"model", "prompt"}
    exact: bool = True

    @property
    def source(self) -> str:
        return f"server {self.pool.base_url}/tokenize"

    async def _post(self, path: str, payload: dict) -> dict:
        status, body = await self.pool.post_json(path, payload)
        if status != 200 or not isinstance(body, dict):
            raise TokenizeError(f"{path} answered HTTP {status}")
        return body

    async def encode(self, text: str) -> list[int]:
        payload = {"content": text} if self.llama_cpp_shape else {"model": self.model, "prompt": text}
        return list((await self._post("/tokenize", payload))["tokens"])

    async def decode(self, ids: list[int]) -> str:
        payload = {"tokens": ids} if self.llama_cpp_shape else {"model": self.model, "tokens": ids}
        body = await self._post("/detokenize", payload)
        return str(body["content"] if "content" in body else body["prompt"])


@dataclass
class LocalTokenizer:
    """A Hugging Face `tokenizer.json` (a file or a checkpoint folder holding one)."""

    path: Path
    exact: bool = True

    def __post_init__(self) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        file = self.path / "tokenizer.json" if self.path.is_dir() else self.path
        if not file.is_file():
            raise ConfigError(f"--tokenizer {self.path}: no tokenizer.json there")
        self._tok = HFTokenizer.from_file(str(file))

    @property
    def source(self) -> str:
        return f"local {self.path}"

    async def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    async def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


_WORD_RE = re.compile(r"\s*[A-Za-z]+|\s*[0-9]|\s*[^\sA-Za-z0-9]|\s+")


@dataclass
class ApproxTokenizer:
    """One token per word or symbol: real BPE gives ~1.3 tokens per English word, so prompt
    lengths are approximate; the server's reported usage is what the records keep."""

    source: str = "approx (word-level; no /tokenize on the server and no --tokenizer given)"
    exact: bool = False
    _vocab: dict[str, int] = field(default_factory=dict)
    _pieces: list[str] = field(default_factory=list)

    async def encode(self, text: str) -> list[int]:
        ids = []
        for piece in _WORD_RE.findall(text):
            if piece not in self._vocab:
                self._vocab[piece] = len(self._pieces)
                self._pieces.append(piece)
            ids.append(self._vocab[piece])
        return ids

    async def decode(self, ids: list[int]) -> str:
        return "".join(self._pieces[i] for i in ids)


async def server_tokenizer(pool: ConnectionPool, model: str) -> ServerTokenizer | None:
    """The server's tokenizer if `/tokenize` and `/detokenize` round-trip a sentence."""
    for llama_cpp_shape in (False, True):
        tok = ServerTokenizer(pool, model, llama_cpp_shape)
        try:
            ids = await tok.encode("Hello world, how are you?")
            if ids and "world" in await tok.decode(ids):
                return tok
        except (TokenizeError, ConnectionError, KeyError, TypeError, ValueError):
            continue
    return None
