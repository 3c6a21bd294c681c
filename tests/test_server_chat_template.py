"""Templates and the tokenizer helpers against a real server that trusts requests' own templates (vLLM's
--trust-request-chat-template; without it such a request is refused: tests/test_server_hostile.py): one that builds a
huge list or loops for hours gets a 400 naming the limit while other requests are served; /tokenize and /detokenize
need the API key and tokenize off the event loop, a long text in a worker process, id for id as the tokenizer."""
from __future__ import annotations

import json
import select
import socket
import threading
import time

import httpx
import pytest

from tally.models.loader import load_checkpoint
from tally.models.tokenizer import load_tokenizer
from tally.models.tokenizer_worker import LONG_TEXT_CHARS, TokenizerWorker
from tally.server.process import ServerProcess
from tests.support.child_processes import worker_niceness

MODEL = "tiny"
KEY = "sk-test-template"
AUTH = {"authorization": f"Bearer {KEY}"}
FLAGS = ["--served-model-name", MODEL, "--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "8MB",
         "--log-level", "warning"]
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BOMB = "{% set x = [0] * 50000000 %}{{ x|length }}"
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def server(tiny_llama):
    with ServerProcess(["--model", str(tiny_llama), *FLAGS, "--trust-request-chat-template", "--api-key", KEY,
                        "--max-body-bytes", "4MiB"]) as s:
        yield s


def _chat(server: ServerProcess, **fields) -> httpx.Response:
    return httpx.post(server.base_url + "/chat/completions", json={**CHAT, **fields}, headers=AUTH, timeout=120.0)


def _in_background(send) -> tuple[threading.Event, list]:
    done, result = threading.Event(), []

    def run() -> None:
        result.append(send())
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, result


def test_the_tokenizer_helpers_need_the_api_key(server):
    for path, body in (("/tokenize", {"prompt": "hello"}), ("/detokenize", {"tokens": [1, 2]})):
        assert httpx.post(server.url + path, json=body).status_code == 401
        assert httpx.post(server.url + path, json=body, headers=AUTH).status_code == 200
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_long_prompt_to_tokenize_does_not_stall_health(server):
    body = json.dumps({"prompt": "hello world " * (3 * 2**20 // 12)}).encode()  # seconds of tokenizing
    with socket.create_connection(("127.0.0.1", server.port)) as tokenize:
        tokenize.sendall(f"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                         .encode() + body)
        time.sleep(0.2)  # the server reads the rest of the body and begins tokenizing
        assert httpx.get(server.url + "/health", timeout=300.0).status_code == 200
        # a server that tokenized on its event loop would have answered /tokenize before /health
        assert not select.select([tokenize], [], [], 0)[0], "/health waited for the tokenizing to finish"
        answer = b"".join(iter(lambda: tokenize.recv(2**20), b""))
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and json.loads(payload)["count"] > 2**18
    too_big = httpx.post(server.url + "/tokenize", json={"prompt": "x" * 5 * 2**20}, headers=AUTH)
    assert too_big.status_code == 413 and "--max-body-bytes" in too_big.json()["error"]["message"]


def test_a_long_text_is_tokenized_in_a_worker_process_as_the_tokenizer_does(server, tiny_llama):
    tokenizer = load_tokenizer(load_checkpoint(str(tiny_llama)))
    text = "Grüße aus 東京 🙂 <|im_end|>  \n\t" * (LONG_TEXT_CHARS // 20)
    messages = [{"role": "user", "content": text}]
    chat = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    plain = tokenizer.encode(text, add_special_tokens=False)
    for body, expected in (({"prompt": text}, tokenizer.encode(text)),
                           ({"prompt": text, "add_special_tokens": False}, plain),
                           ({"messages": messages}, tokenizer.encode(chat, add_special_tokens=False))):
        r = httpx.post(server.url + "/tokenize", json=body, headers=AUTH, timeout=120.0)
        assert r.status_code == 200 and r.json() == {"count": len(expected), "max_model_len": 256, "tokens": expected}
    assert worker_niceness(server.proc.pid, TokenizerWorker.__module__), "no tokenizer worker process"


def test_a_template_that_builds_a_huge_list_gets_a_400_naming_the_limit(server):
    r = _chat(server, chat_template=BOMB)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "chat_template" and "1,000,000" in error["message"], error
    assert _chat(server).status_code == 200


def test_a_template_that_loops_for_hours_fails_alone_while_others_are_served(server):
    done, result = _in_background(lambda: _chat(server, chat_template=NESTED_LOOPS))
    done.wait(0.3)  # a head start: the template is rendering
    normal = _chat(server)
    assert normal.status_code == 200 and not done.is_set(), "the normal request waited for the template"
    done.wait()
    error = result[0].json()["error"]
    assert result[0].status_code == 400 and error["param"] == "chat_template" and " s to render" in error["message"]
    served = _chat(server, chat_template="{{ messages[0].content }}")  # the killed worker was replaced
    assert served.status_code == 200 and served.json()["usage"]["prompt_tokens"] >= 1
    assert httpx.get(server.url + "/health").status_code == 200
    assert "Traceback" not in server.log()
