"""LoRA adapters on the server, as vLLM serves them: listed in /v1/models with their base as `parent`, and loaded or
unloaded at run time by /v1/load_lora_adapter and /v1/unload_lora_adapter, which exist only where the environment
opts in (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, vLLM's switch, or TALLY_ALLOW_RUNTIME_LORA_UPDATING)."""
from __future__ import annotations

import asyncio
import os

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from tally.engine.async_engine import AsyncEngine
from tally.errors import InvalidRequestError, ModelNotFoundError, echo
from tally.lora_request import LoRARequest
from tally.server.errors import error_response
from tally.server.lifecycle import ServerState, read_json

RUNTIME_SWITCHES = ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "TALLY_ALLOW_RUNTIME_LORA_UPDATING")


def runtime_updates_allowed() -> bool:
    return any(os.environ.get(name, "").strip().lower() in ("1", "true") for name in RUNTIME_SWITCHES)


def adapter_cards(state: ServerState, created_s: int) -> list[dict]:
    """/v1/models entries of the adapters: `root` the adapter's folder or file, `parent` its base (vLLM's fields)."""
    return [{"id": name, "object": "model", "created": created_s, "owned_by": "tally", "root": lora.lora_path,
             "parent": lora.base_model_name or state.model_name, "max_model_len": state.max_model_len}
            for name, lora in state.loras.items()]


def add_lora_routes(app: FastAPI, state: ServerState, async_engine: AsyncEngine) -> None:
    if not runtime_updates_allowed():
        return

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        try:
            body = _fields(await read_json(request, state.max_body_bytes), ("lora_name", "lora_path"))
            name, path = body.get("lora_name"), body.get("lora_path")
            if not (isinstance(name, str) and name and isinstance(path, str) and path):
                raise InvalidRequestError("send both lora_name and lora_path (the adapter's folder or .gguf file) "
                                          "as strings", param="lora_name" if not name else "lora_path")
            if name in state.loras or name in state.model_names or name == state.model_name:
                raise InvalidRequestError(f"The lora adapter {echo(name)} has already been loaded; unload it "
                                          "first, or load this one under another name", param="lora_name")
            loras = async_engine.engine.loras
            if loras is None:
                raise InvalidRequestError("this server runs without LoRA; start it with --enable-lora to load "
                                          "adapters", param="lora_name")
            lora = LoRARequest(name, max((r.lora_int_id for r in state.loras.values()), default=0) + 1, path)
            await asyncio.to_thread(loras.key_for, lora)  # reads and checks it: a bad adapter is refused here
            state.loras[name] = lora
            return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")
        except Exception as exc:  # noqa: BLE001
            return error_response(exc)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        try:
            body = _fields(await read_json(request, state.max_body_bytes), ("lora_name", "lora_int_id"))
            name = body.get("lora_name")
            if not isinstance(name, str) or not name:
                raise InvalidRequestError("send lora_name, the adapter to unload", param="lora_name")
            lora = state.loras.pop(name, None)
            if lora is None:
                raise ModelNotFoundError(f"The lora adapter {echo(name)} cannot be found", param="lora_name")
            loras = async_engine.engine.loras
            if loras is not None:
                loras.forget(lora)
            return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
        except Exception as exc:  # noqa: BLE001
            return error_response(exc)


def _fields(body: dict, known: tuple[str, ...]) -> dict:
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise InvalidRequestError(f"unknown field(s) {unknown}; this endpoint takes {', '.join(known)}",
                                  param=unknown[0])
    return body
