"""`tally run-batch -i requests.jsonl -o results.jsonl`: an OpenAI batch file run offline, as `vllm run-batch` runs
it. Each line's body goes to the same app `tally serve` answers with, in this process and concurrently so the engine
batches them; each result is appended as it completes, so a rerun skips the custom_ids already in the output."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tally.engine.args import add_engine_args, config_from_args
from tally.engine.load_engine import load_engine
from tally.errors import ConfigError, InvalidRequestError, TallyError, error_body
from tally.flags import LOG_LEVEL, parser
from tally.server.answer_flags import add_answer_flags, check_answer_flags
from tally.server.app import ServerConfig, build_app

# A line's fields, as OpenAI's batch API and vLLM's define them.
LINE_FIELDS = ("custom_id", "method", "url", "body")


@dataclass(frozen=True)
class BatchLine:
    custom_id: str
    url: str
    body: dict[str, Any]


def build_parser() -> argparse.ArgumentParser:
    p = parser("tally run-batch", "Run an OpenAI batch file (JSON lines) offline, as vllm run-batch.")
    p.add_argument("-i", "--input-file", type=Path, required=True,
                   help="one request a line: {custom_id, method: POST, url: /v1/chat/completions or /v1/completions "
                        "(any POST route tally serve has), body}")
    p.add_argument("-o", "--output-file", type=Path, required=True,
                   help="results, one a line {id, custom_id, response: {status_code, request_id, body}, error}; "
                        "appended as they complete, and the custom_ids already there are not run again")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="requests in flight at once (default: twice --max-num-seqs)")
    add_answer_flags(p)
    LOG_LEVEL.add(p)
    add_engine_args(p)
    return p


def read_lines(path: Path) -> list[BatchLine]:
    """The file's requests; ConfigError naming the line and field of the first one that is not a batch request."""
    lines, seen = [], set()
    for number, text in enumerate(path.read_text().splitlines(), 1):
        if not text.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{where} is not JSON ({e})") from None
        missing = [f for f in LINE_FIELDS if not isinstance(obj, dict) or f not in obj]
        if missing:
            raise ConfigError(f"{where} lacks {', '.join(missing)}; each line is {{{', '.join(LINE_FIELDS)}}}")
        if obj["method"] != "POST" or not isinstance(obj["url"], str) or not obj["url"].startswith("/v1/"):
            raise ConfigError(f"{where}: method must be POST and url a /v1/ route, got {obj['method']} {obj['url']}")
        if not isinstance(obj["body"], dict) or not isinstance(obj["custom_id"], str):
            raise ConfigError(f"{where}: custom_id must be a string and body an object")
        if obj["custom_id"] in seen:
            raise ConfigError(f"{where}: custom_id {obj['custom_id']!r} is used twice; each line needs its own")
        seen.add(obj["custom_id"])
        lines.append(BatchLine(obj["custom_id"], obj["url"], obj["body"]))
    return lines


def done_ids(path: Path) -> set[str]:
    """custom_ids with a result in the output already; a last line cut short by a crash does not count."""
    if not path.exists():
        return set()
    done = set()
    for text in path.read_text().splitlines():
        try:
            done.add(json.loads(text)["custom_id"])
        except (ValueError, KeyError, TypeError):
            continue
    return done


async def run_lines(app: Any, lines: list[BatchLine], out: Any, max_concurrency: int) -> None:
    """Every line through the app; each result written and flushed as it completes."""
    slots, failed, finished = asyncio.Semaphore(max_concurrency), 0, 0
    step = max(1, len(lines) // 10)

    async def one(client: httpx.AsyncClient, line: BatchLine) -> None:
        nonlocal failed, finished
        async with slots:
            result = await _request(client, line)
        out.write(json.dumps(result, ensure_ascii=False) + "\n")
        out.flush()
        failed += result["error"] is not None
        finished += 1
        if finished % step == 0 or finished == len(lines):
            print(f"run-batch: {finished}/{len(lines)} done, {failed} failed", file=sys.stderr, flush=True)

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)  # a 500 is one line's result
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=None) as client:
            await asyncio.gather(*(one(client, line) for line in lines))


async def _request(client: httpx.AsyncClient, line: BatchLine) -> dict[str, Any]:
    if line.body.get("stream"):
        status, body = 400, error_body(InvalidRequestError("stream: a batch line's answer is written whole; drop the "
                                                           "field", param="stream"))
    else:
        answer = await client.post(line.url, json=line.body)
        status = answer.status_code
        try:
            body = answer.json()
        except ValueError:  # an unexpected failure's plain text
            body = error_body(TallyError(answer.text))
    error = None
    if status >= 400:
        error = {"code": status, "message": (body.get("error") or {}).get("message", str(body))}
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line.custom_id,
            "response": {"status_code": status, "request_id": body.get("id", f"tally-batch-{uuid.uuid4().hex}"),
                         "body": body},
            "error": error}


def main(argv: list[str]) -> int:
    p = build_parser()
    ns = p.parse_args(argv)
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    check_answer_flags(p, ns)
    if ns.max_concurrency is not None and ns.max_concurrency < 1:
        p.error("--max-concurrency must be ≥ 1")
    try:
        lines = read_lines(ns.input_file)
        done = done_ids(ns.output_file)
        todo = [line for line in lines if line.custom_id not in done]
        print(f"run-batch: {len(lines)} requests, {len(lines) - len(todo)} already in {ns.output_file}",
              file=sys.stderr, flush=True)
        if not todo:
            return 0
        engine = load_engine(config_from_args(ns))
    except TallyError as exc:
        print(f"tally run-batch: {exc.message}", file=sys.stderr)
        return 2
    app = build_app(engine, ServerConfig(chat_template=ns.chat_template, reasoning_parser=ns.reasoning_parser,
                                         tool_call_parser=ns.tool_call_parser if ns.enable_auto_tool_choice
                                         else None))
    with ns.output_file.open("a") as out:
        if out.tell() and not ns.output_file.read_text().endswith("\n"):
            out.write("\n")  # a line a crash cut short stays alone (and unread), not glued to the next
        try:
            asyncio.run(run_lines(app, todo, out, ns.max_concurrency or 2 * engine.config.max_num_seqs))
        finally:
            engine.shutdown()
    return 0  # as vLLM's: a request that failed is reported in its line, not by the run
