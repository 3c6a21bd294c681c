"""A tiny checkpoint whose vocabulary has `<think>` and `</think>` as single tokens (as Qwen3's and DeepSeek-R1's
do), for tests of --reasoning-parser: a random model writes the tags when sampling is narrowed to a few tokens."""
from __future__ import annotations

from pathlib import Path

from support.tiny_models import make_checkpoint, make_tokenizer

THINK_TAGS = ("<think>", "</think>")
# Qwen3's generation prompt: with enable_thinking false it closes an empty thinking section itself.
QWEN3_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)
# DeepSeek-R1's: the template opens the thinking, the model writes only its end.
R1_TEMPLATE = QWEN3_TEMPLATE.replace("{% if enable_thinking is defined and enable_thinking is false %}"
                                     "{{ '<think>\n\n</think>\n\n' }}{% endif %}", "{{ '<think>\n' }}")


def think_checkpoint(out: Path) -> Path:
    """The tiny qwen3 checkpoint with two more tokens, the think tags, added after the trained vocabulary."""
    from tokenizers import AddedToken, Tokenizer

    make_tokenizer(out / "vocab")
    trained = Tokenizer.from_file(str(out / "vocab" / "tokenizer.json")).get_vocab_size()
    make_checkpoint(out, "qwen3", vocab_size=trained + len(THINK_TAGS))
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TAGS])
    tok.save(str(out / "tokenizer.json"))
    return out
