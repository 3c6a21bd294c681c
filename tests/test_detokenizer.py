from __future__ import annotations

import random

import pytest
import transformers

from tally.engine.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Unicode: café naïve 日本語 中文 emoji 🙂🚀 ñandú Ωμέγα",
    "The quick brown fox 🦊 jumps over the lazy dog 🐶 — ¿qué? 東京タワー",
    "def add(a, b):\n    return a + b  # 加法 ✓\n",
    "🙂🙂🙂 🚀🚀 👩‍👩‍👧 é́ 𝔘𝔫𝔦",
]


@pytest.fixture(scope="module", params=["rust_decode", "transformers_decode"])
def tokenizer(tiny_llama, request):
    tok = transformers.AutoTokenizer.from_pretrained(tiny_llama)
    # With clean-up on, the detokenizer goes through tokenizer.decode instead of the Rust decoder.
    tok.clean_up_tokenization_spaces = request.param == "transformers_decode"
    return tok


def stream(tokenizer, ids, chunk_sizes=None, **kwargs):
    detok = IncrementalDetokenizer(tokenizer, prompt_token_ids=[1, 5, 6], **kwargs)
    deltas, i = [], 0
    while i < len(ids):
        size = chunk_sizes.pop(0) if chunk_sizes else 1
        deltas.append(detok.push(ids[i : i + size]))
        i += size
    deltas.append(detok.flush())
    return detok, deltas


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_deltas_join_to_the_full_decode_without_broken_characters(tokenizer, text):
    ids = tokenizer.encode(text)
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)  # the text really splits characters
    detok, deltas = stream(tokenizer, ids)
    assert "".join(deltas) == detok.text == tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)


def test_pushing_several_tokens_at_once_gives_the_same_text(tokenizer):
    ids = tokenizer.encode(TEXTS[1])
    sizes = [3, 1, 2, 5, 1, 1, 4] * 20
    detok, deltas = stream(tokenizer, ids, chunk_sizes=sizes)
    assert "".join(deltas) == tokenizer.decode(ids)


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_follow_skip_special_tokens(tokenizer, skip):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = tokenizer.encode("Hi 🙂") + [im_end] + tokenizer.encode(" ok")
    detok, deltas = stream(tokenizer, ids, skip_special_tokens=skip)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=skip)
    assert ("<|im_end|>" in detok.text) is not skip


def test_random_ids_match_the_full_decode_and_hold_back_only_unfinished_characters(tokenizer):
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(3, len(tokenizer)) for _ in range(rng.randrange(1, 40))]
        full = tokenizer.decode(ids)
        detok, deltas = stream(tokenizer, ids)
        assert "".join(deltas) == full
        if "\ufffd" not in full:
            assert not any("\ufffd" in d for d in deltas)


def test_a_character_cut_by_the_end_of_generation_comes_out_on_flush(tokenizer):
    ids = tokenizer.encode("a🚀")
    cut = next(n for n in range(1, len(ids)) if tokenizer.decode(ids[:n]).endswith("\ufffd"))
    detok = IncrementalDetokenizer(tokenizer, [])
    assert "\ufffd" not in detok.push(ids[:cut])
    assert detok.text + detok.flush() == tokenizer.decode(ids[:cut])
