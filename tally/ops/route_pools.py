"""Length pools for `tally route`: named groups of replicas, one of them the long pool, and the rule that picks a
request's pool from the tokens it needs (tally/ops/route_length.py counts them). A request goes to the long pool
when it needs more than the threshold, and never to a pool whose max_model_len is known to be too short for it."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tally.errors import ConfigError, InvalidRequestError

MAIN = "main"  # the pool `--replica` URLs form


@dataclass(frozen=True)
class PoolsConfig:
    pools: tuple[tuple[str, tuple[str, ...]], ...]  # (name, replica URLs), in the order given
    long_pool: str | None = None  # None: one pool, no length routing
    long_threshold_tokens: int | None = None  # None: the main pool's max_model_len, read from its replicas

    @property
    def main_pool(self) -> str:
        return next(name for name, _ in self.pools if name != self.long_pool)

    @classmethod
    def from_args(cls, replicas: list[str] | None, pools: list[str] | None, long_pool: str | None,
                  long_threshold: str | None) -> PoolsConfig:
        """`--replica URL`s (pool `main`), `--pool NAME=URL[,URL...]`s, `--long-pool NAME` and `--long-threshold
        TOKENS|plan.json`, checked once."""
        named: dict[str, tuple[str, ...]] = {MAIN: tuple(u.rstrip("/") for u in replicas)} if replicas else {}
        for text in pools or ():
            name, sep, urls = text.partition("=")
            name, listed = name.strip(), tuple(u.strip().rstrip("/") for u in urls.split(",") if u.strip())
            if not sep or not name or not listed:
                raise ConfigError(f"--pool {text!r}: write it NAME=URL[,URL...], e.g. long=http://10.0.0.7:8000")
            if name in named:
                raise ConfigError(f"--pool {name} is given twice" + (" (--replica URLs form the pool main)"
                                                                     if name == MAIN else ""))
            named[name] = listed
        if not named:
            raise ConfigError("give the replicas: --replica URL (repeat), or --pool NAME=URL[,URL...] per pool")
        every = [u for urls in named.values() for u in urls]
        twice = sorted({u for u in every if every.count(u) > 1})
        if twice:
            raise ConfigError(f"{twice[0]} is in more than one pool; a replica serves one pool")
        if long_pool is None:
            if long_threshold is not None or len(named) > 1:
                raise ConfigError("several pools, or --long-threshold, need --long-pool NAME: the pool that takes "
                                  "requests above the threshold")
            return cls(tuple(named.items()))
        if long_pool not in named:
            raise ConfigError(f"--long-pool {long_pool}: no such pool; the pools are {', '.join(named)}")
        if len(named) != 2:
            raise ConfigError(f"--long-pool needs exactly two pools, the main one and {long_pool}; got "
                              f"{len(named)} ({', '.join(named)})")
        return cls(tuple(named.items()), long_pool, _threshold(long_threshold))


def _threshold(text: str | None) -> int | None:
    """`--long-threshold`: a number of tokens, or a `tally plan --out` file whose main pool's max_model_len it is."""
    if text is None:
        return None
    if text.strip().isdigit():
        tokens = int(text)
    else:
        path = Path(text)
        try:
            tokens = int(json.loads(path.read_text())["pools"]["long_threshold_tokens"])
        except OSError as exc:
            raise ConfigError(f"--long-threshold {text}: neither a number of tokens nor a file that can be read "
                              f"({exc.strerror})") from None
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"--long-threshold {text}: not a `tally plan --lengths ... --out FILE` result (it "
                              "has no pools.long_threshold_tokens)") from None
    if tokens < 1:
        raise ConfigError(f"--long-threshold must be at least 1 token, got {tokens}")
    return tokens


@dataclass(frozen=True)
class Need:
    """What a request needs of a pool's context: its prompt and the tokens it may generate."""
    prompt_tokens: int
    max_tokens: int | None  # None: not given, so it generates until its pool's context is full
    exact: bool  # counted by a replica's tokenizer, else an upper bound

    @property
    def total_tokens(self) -> int:
        # Without max_tokens the output stops at the context's end: any pool that holds the prompt holds it.
        return self.prompt_tokens + (self.max_tokens if self.max_tokens is not None else 1)


def pool_order(config: PoolsConfig, max_model_lens: dict[str, int | None], need: Need) -> list[str]:
    """The pools to try, best first: the long pool for a request above the threshold, else the main one, then the
    other one as failover; a pool whose max_model_len is known to be too short is left out. When none is left, a
    400 that says why."""
    main, long = config.main_pool, config.long_pool
    threshold = config.long_threshold_tokens or max_model_lens.get(main)
    is_long = threshold is not None and need.total_tokens > threshold
    order = [long, main] if is_long else [main, long]
    fits = [name for name in order if max_model_lens.get(name) is None or need.total_tokens <= max_model_lens[name]]
    if fits:
        return fits
    longest = max(max_model_lens.values())
    counted = "" if need.exact else " (an upper bound: no replica could count them)"
    asked = f" + max_tokens {need.max_tokens:,}" if need.max_tokens is not None else ""
    raise InvalidRequestError(
        f"the request needs {need.total_tokens:,} tokens (prompt {need.prompt_tokens:,}{counted}{asked}) but the "
        f"longest pool's max_model_len is {longest:,} ({', '.join(f'{n} {m:,}' for n, m in max_model_lens.items())});"
        " shorten the prompt or lower max_tokens",
        param="prompt" if need.prompt_tokens >= longest or need.max_tokens is None else "max_tokens")
