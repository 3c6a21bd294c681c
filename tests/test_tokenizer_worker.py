"""Long texts tokenized in a worker process give what the tokenizer gives in this process, id for id (the built-in
model's tokenizer, and one that adds a BOS: multi-byte characters, special-token markup, whitespace runs, with and
without special tokens); the worker runs below the caller's priority and is replaced when it was killed."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest
from tokenizers import Tokenizer, processors
from transformers import PreTrainedTokenizerFast

from tally.models.loader import load_checkpoint
from tally.models.registry import resolve_model
from tally.models.tokenizer import load_tokenizer
from tally.models.tokenizer_worker import LONG_TEXT_CHARS, TOKENIZER_NICENESS, TokenizerWorker
from tests.support.child_processes import worker_niceness
from tests.support.tiny_models import make_tokenizer

TEXTS = [
    "",
    "hello world",
    "Zürich, 東京 and 🙂🙂 — «quoted» \u2028 naïve café",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "  two  spaces,\ttabs\t\tand\n\n\nnewlines   \n",
    ("Grüße aus 日本 🙂 <|im_end|> " * (LONG_TEXT_CHARS // 20))[:LONG_TEXT_CHARS + 7],
]


@pytest.fixture(scope="module")
def builtin_tokenizer():
    return load_tokenizer(load_checkpoint(str(resolve_model(None).path)))


@pytest.fixture(scope="module")
def bos_tokenizer(tmp_path_factory):
    """A BOS from the tokenizer's own post-processor, as Llama 3's tokenizer.json has it."""
    path = tmp_path_factory.mktemp("bos-tokenizer")
    make_tokenizer(path)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    bos = "<|im_start|>"
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                       special_tokens=[(bos, tok.token_to_id(bos))])
    tok.save(str(path / "tokenizer.json"))
    tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    assert tok.encode("hi") != tok.encode("hi", add_special_tokens=False)  # it does add one
    return tok


def _in_worker(worker: TokenizerWorker, text: str, add_special_tokens: bool) -> list[int]:
    count, ids = asyncio.run(worker.encode_json(text, add_special_tokens))
    ids = json.loads(ids)
    assert count == len(ids)
    return ids


@pytest.mark.parametrize("which", ["builtin_tokenizer", "bos_tokenizer"])
def test_a_worker_tokenizes_as_the_tokenizer_does(request, which):
    tokenizer = request.getfixturevalue(which)
    worker = TokenizerWorker(tokenizer)
    try:
        for text in TEXTS:
            for special in (True, False):
                assert _in_worker(worker, text, special) == tokenizer.encode(text, add_special_tokens=special), \
                    (text[:40], special)
    finally:
        worker.close()


def test_the_worker_runs_below_the_callers_priority_and_is_replaced_when_killed(bos_tokenizer):
    worker = TokenizerWorker(bos_tokenizer)
    try:
        expected = bos_tokenizer.encode(TEXTS[2])
        assert _in_worker(worker, TEXTS[2], True) == expected
        own = os.getpriority(os.PRIO_PROCESS, 0)
        (pid, niceness), = worker_niceness(os.getpid(), TokenizerWorker.__module__).items()
        assert niceness == min(19, own + TOKENIZER_NICENESS)
        os.kill(pid, signal.SIGKILL)
        # Dead and waitable, not yet reaped. Not /proc's "Z": a process's first thread shows it while the worker's
        # other thread is still exiting, and until that one has, waitpid does not report the process.
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            time.sleep(0.01)
        assert _in_worker(worker, TEXTS[2], True) == expected
        assert list(worker_niceness(os.getpid(), TokenizerWorker.__module__)) != [pid]
    finally:
        worker.close()
