"""The engine's LoRA adapters: read and checked when first asked for (--lora-modules at start, a request's
LoRARequest, /v1/load_lora_adapter), held in memory up to --max-cpu-loras (least recently used out, read again when
asked), and set up for each step that has adapter rows (tally/layers/lora.py)."""
from __future__ import annotations

import contextlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator

import torch

from tally.core.scheduler import SchedulerOutput
from tally.errors import ConfigError, InvalidRequestError, echo
from tally.layers.lora import LoRAProjection, LoRASlots
from tally.lora_request import LoRARequest
from tally.models.decoder import CausalLM
from tally.models.lora_adapter import LoRAAdapter, adapter_bytes_at_rank, load_adapter
from tally.models.lora_gguf import load_gguf_adapter
from tally.pooling_params import PoolingParams

_SITES = {"qkv_proj": "qkv", "o_proj": "o", "gate_up_proj": "gate_up", "down_proj": "down"}


def parse_lora_modules(modules: str | list[str] | None) -> list[LoRARequest]:
    """--lora-modules items, `name=path` or vLLM's JSON `{"name": .., "path": .., "base_model_name": ..}`, as
    LoRARequests numbered from 1 in the order given."""
    items = [modules] if isinstance(modules, str) else list(modules or [])
    requests: list[LoRARequest] = []
    for item in items:
        if isinstance(item, LoRARequest):
            requests.append(item)
            continue
        if item.lstrip().startswith("{"):
            try:
                spec = json.loads(item)
                name, path, base = spec["name"], spec["path"], spec.get("base_model_name")
            except (ValueError, KeyError, TypeError):
                raise ConfigError(f"lora_modules item {item!r} is not JSON with \"name\" and \"path\"; write "
                                  "name=path or '{\"name\": \"sql\", \"path\": \"/adapters/sql\"}'",
                                  param="lora_modules") from None
        else:
            name, sep, path = item.partition("=")
            base = None
            if not (sep and name and path):
                raise ConfigError(f"lora_modules item {item!r} is not name=path; write e.g. sql=/adapters/sql",
                                  param="lora_modules")
        if any(r.lora_name == name for r in requests):
            raise ConfigError(f"lora_modules names {name!r} twice; give each adapter its own name",
                              param="lora_modules")
        requests.append(LoRARequest(name, len(requests) + 1, path, base))
    return requests


class LoRAManager:
    def __init__(self, model: CausalLM, max_loras: int, max_lora_rank: int, max_cpu_loras: int) -> None:
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self._cfg, self._dtype = model.cfg, model.dtype
        self._lock = threading.Lock()  # loads come from the server's threads while the engine thread steps
        self._keys: dict[tuple[str, str], str] = {}  # (name, path) → adapter key
        self._paths: dict[str, tuple[str, str]] = {}  # adapter key → (name, path), to read it again
        self._resident: OrderedDict[str, LoRAAdapter] = OrderedDict()  # key → adapter, least recently used first
        self.slots = LoRASlots()
        model.lora = self.slots
        for i, layer in enumerate(model.layers):
            for attr, site in _SITES.items():
                if hasattr(layer, attr):  # a mixture-of-experts layer has no gate_up / down of its own
                    setattr(layer, attr, LoRAProjection(getattr(layer, attr), self.slots, i, site))

    def ledger(self) -> dict:
        """The ledger's entry: capacity_bytes is what --max-cpu-loras adapters of --max-lora-rank take, every
        projection targeted."""
        return {"max_cpu_loras": self.max_cpu_loras, "max_lora_rank": self.max_lora_rank, "max_loras": self.max_loras,
                "capacity_bytes": self.max_cpu_loras * adapter_bytes_at_rank(self._cfg, self.max_lora_rank,
                                                                             self._dtype)}

    def serve(self, modules: str | list[str] | None, base_names: tuple[str, ...]) -> dict[str, LoRARequest]:
        """--lora-modules by name, each read and checked now rather than at its first request."""
        served = {r.lora_name: r for r in parse_lora_modules(modules)}
        for request in served.values():
            if request.lora_name in base_names:
                raise ConfigError(f"--lora-modules names an adapter {request.lora_name!r}, the base model's own name; "
                                  "give the adapter another name", param="lora_modules")
            try:
                self.key_for(request)
            except InvalidRequestError as exc:
                raise ConfigError(f"--lora-modules: {exc.message}", param="lora_modules") from None
        return served

    def key_for(self, request: LoRARequest) -> str:
        """The adapter's key (its digest), reading and checking it the first time its name and path are seen."""
        with self._lock:
            key = self._keys.get((request.lora_name, request.lora_path))
        if key is not None:
            return key
        adapter = self._read(request.lora_name, request.lora_path)  # outside the lock: steps go on meanwhile
        with self._lock:
            self._keys[(request.lora_name, request.lora_path)] = adapter.key
            self._paths[adapter.key] = (request.lora_name, request.lora_path)
            self._keep(adapter)
            return adapter.key

    def forget(self, request: LoRARequest) -> None:
        """An adapter unloaded: its memory goes now; requests already running with it read it again."""
        with self._lock:
            key = self._keys.pop((request.lora_name, request.lora_path), None)
            if key is not None and key not in self._keys.values():
                self._resident.pop(key, None)

    @contextlib.contextmanager
    def step(self, out: SchedulerOutput, row_start: list[int], num_rows: int) -> Iterator[None]:
        """Within it, the model adds each scheduled request's adapter delta to its rows."""
        keys = list(dict.fromkeys(s.request.lora_key for s in out.scheduled if s.request.lora_key is not None))
        if not keys:
            yield
            return
        slot = {k: i for i, k in enumerate(keys)}
        row_slots = torch.full((num_rows,), -1)
        for s, start in zip(out.scheduled, row_start):
            if s.request.lora_key is not None:
                row_slots[start:start + s.num_new_tokens] = slot[s.request.lora_key]
        with self._lock:
            adapters = [self._adapter(k) for k in keys]
        self.slots.begin(keys, [a.weights for a in adapters], row_slots)
        try:
            yield
        finally:
            self.slots.end()

    def _adapter(self, key: str) -> LoRAAdapter:
        adapter = self._resident.get(key)
        if adapter is None:  # evicted from memory since: read again
            name, path = self._paths[key]
            adapter = self._read(name, path)
            self._keep(adapter)
        self._resident.move_to_end(key)
        return adapter

    def _read(self, name: str, path: str) -> LoRAAdapter:
        load = load_gguf_adapter if path.lower().endswith(".gguf") else load_adapter
        return load(name, path, self._cfg, self.max_lora_rank, self._dtype)

    def _keep(self, adapter: LoRAAdapter) -> None:
        self._resident[adapter.key] = adapter
        self._resident.move_to_end(adapter.key)
        while len(self._resident) > self.max_cpu_loras:
            self._resident.popitem(last=False)


def adapter_key(loras: LoRAManager | None, request: LoRARequest, params: object) -> str:
    """The key a generation request's adapter goes by (LoRAManager.key_for), or why it cannot have one."""
    if loras is None:
        raise InvalidRequestError(f"a LoRA adapter ({echo(request.lora_name)}) was asked for, but the engine was "
                                  "started without LoRA; start it with --enable-lora (enable_lora=True)",
                                  param="lora_request")
    if isinstance(params, PoolingParams):
        raise InvalidRequestError("LoRA adapters serve generation only; embed with the base model", param="model")
    return loras.key_for(request)
