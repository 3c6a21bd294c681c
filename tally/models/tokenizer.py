"""The tokenizer of a checkpoint (HF tokenizer.json, or rebuilt from GGUF metadata by transformers),
loaded strictly from local files, and the token ids that end generation."""
from __future__ import annotations

from typing import TYPE_CHECKING

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tally.errors import InvalidRequestError, ModelLoadError
from tally.models.config import ModelConfig

if TYPE_CHECKING:
    from tally.models.loader import Checkpoint

Tokenizer = PreTrainedTokenizerFast  # what load_tokenizer returns; the type every module that takes one names

# More characters than any vocabulary's tokens hold in practice: a text longer than a context of N tokens at this
# many characters a token cannot fit it, and is refused before tokenizing (which holds the GIL for its whole length).
MAX_CHARS_PER_TOKEN = 64

# Special tokens chat templates close a turn with; the model emits them when it is done answering.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|end_of_turn|>")


def load_tokenizer(ckpt: "Checkpoint") -> Tokenizer:
    """A fast tokenizer with the checkpoint's chat template; never touches the network."""
    if ckpt.format == "hf" and not (ckpt.path / "tokenizer.json").is_file():
        raise ModelLoadError(
            f"{ckpt.path} has no tokenizer.json; copy tokenizer.json and tokenizer_config.json "
            "from the model's repository next to config.json"
        )
    try:
        if ckpt.format == "gguf":
            # The tokenizers-backed class directly: AutoTokenizer would first parse the whole GGUF
            # a second time (gguf.GGUFReader: seconds) only to learn the config class.
            tok = PreTrainedTokenizerFast.from_pretrained(
                str(ckpt.path.parent), gguf_file=ckpt.path.name, local_files_only=True
            )
        else:
            tok = AutoTokenizer.from_pretrained(str(ckpt.path), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load the tokenizer of {ckpt.path}: {exc}") from exc
    if not isinstance(tok, PreTrainedTokenizerFast):
        raise ModelLoadError(
            f"{ckpt.path} has only a slow ({type(tok).__name__}) tokenizer; Tally needs a tokenizer.json"
        )
    return tok


def stop_token_ids(tok: Tokenizer, config: ModelConfig) -> tuple[int, ...]:
    """config.eos_token_ids (the loader already merged generation_config.json's), the tokenizer's
    eos, and the special token the chat template ends each turn with."""
    ids = list(config.eos_token_ids)
    if tok.eos_token_id is not None:
        ids.append(tok.eos_token_id)
    template = tok.chat_template if isinstance(tok.chat_template, str) else ""
    vocab = tok.get_vocab()
    ids += [vocab[token] for token in END_OF_TURN_TOKENS if token in template and token in vocab]
    return tuple(dict.fromkeys(int(i) for i in ids))


def encode_within(tok: Tokenizer, text: str, max_tokens: int, *, param: str, keep_last: int | None = None,
                  add_special_tokens: bool = True) -> list[int]:
    """`text`'s token ids, refused without tokenizing it when no context of `max_tokens` could hold it. With
    `keep_last` (truncate_prompt_tokens) only the text's end that can hold that many tokens is tokenized."""
    if keep_last is not None:
        text = text[-keep_last * MAX_CHARS_PER_TOKEN:]
    elif len(text) > max_tokens * MAX_CHARS_PER_TOKEN:
        raise InvalidRequestError(
            f"{param} has {len(text):,} characters, more than a context of {max_tokens:,} tokens can hold (at most "
            f"{MAX_CHARS_PER_TOKEN} characters a token); shorten it", param=param)
    return tok.encode(text, add_special_tokens=add_special_tokens)
