"""The calibration set: a JSONL of prompts rendered exactly as the deployment will render them.

Each line is {"prompt": "..."} (one user turn) or {"messages": [{"role": ..., "content": ...}, ...]}; a directory
is read as a `tally serve --request-log --log-prompts` log (its records that hold prompts). Lines are
rendered through the model's chat template *including* any system prompt — the system prompt is part of what the
deployed model sees on every request, so its activations must be in the statistics. With a deployment system
prompt given, samples that have none get it prepended. Warnings (returned, printed by the CLI) flag what makes
calibration unrepresentative: fewer than 128 samples, or no system prompt anywhere.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tally.errors import ConfigError
from tally.models.chat_template import join_turns, render_chat
from tally.traces import json_lines

if TYPE_CHECKING:
    from tally.models.tokenizer import Tokenizer

RECOMMENDED_SAMPLES = 128


@dataclass(frozen=True)
class CalibrationSet:
    token_ids: list[list[int]]
    warnings: list[str]

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)


def _lines(path: Path) -> list[str]:
    """A JSONL file's lines, or, for a `tally serve --request-log` directory, its records that hold prompts."""
    if not path.is_dir():
        return json_lines(path.read_text(encoding="utf-8"))
    lines = [ln for f in sorted(path.glob("*.jsonl")) for ln in json_lines(f.read_text(encoding="utf-8"))
             if '"messages"' in ln or '"prompt"' in ln]
    if not lines:
        raise ConfigError(f"the request log {path} holds no prompts; start tally serve with --log-prompts to "
                          "calibrate on real traffic", param="calib")
    return lines


def _messages(record: Any, where: str) -> list[dict[str, str]]:
    if isinstance(record, dict) and isinstance(record.get("messages"), list) and record["messages"]:
        return [{"role": str(m["role"]), "content": _text(m.get("content"))} for m in record["messages"]]
    if isinstance(record, dict) and isinstance(record.get("prompt"), str):
        return [{"role": "user", "content": record["prompt"]}]
    raise ConfigError(f"{where}: each line needs a 'prompt' string or a non-empty 'messages' list", param="calib")


def _text(content: Any) -> str:
    """OpenAI content: a string, or a list of parts of which the text parts count."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def load_calibration(path: str | Path, tokenizer: Tokenizer, *, max_samples: int = 256, max_tokens: int = 512,
                     deployment_system_prompt: str | None = None) -> CalibrationSet:
    """The first `max_samples` lines of `path`, each rendered and cut to `max_tokens` tokens."""
    path = Path(path)
    try:
        lines = _lines(path)[:max_samples]
    except OSError as exc:
        raise ConfigError(f"cannot read the calibration set {path}: {exc}", param="calib") from exc
    if not lines:
        raise ConfigError(f"calibration set {path} is empty; give a JSONL of prompts", param="calib")
    conversations = []
    for number, line in enumerate(lines, 1):
        try:
            conversations.append(_messages(json.loads(line), f"{path}:{number}"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{number} is not JSON ({exc})", param="calib") from exc
    has_system = any(c[0]["role"] == "system" for c in conversations)
    if deployment_system_prompt:
        conversations = [c if c[0]["role"] == "system" else [{"role": "system", "content": deployment_system_prompt},
                                                            *c] for c in conversations]
    token_ids = [tokenizer.encode(_render(tokenizer, c), add_special_tokens=False)[:max_tokens] for c in conversations]
    warnings = []
    if len(token_ids) < RECOMMENDED_SAMPLES:
        warnings.append(f"the calibration set has {len(token_ids)} samples; GPTQ/AWQ statistics are noisy below "
                        f"{RECOMMENDED_SAMPLES}: add prompts like the ones the deployment serves")
    if not has_system and not deployment_system_prompt:
        warnings.append("no calibration sample has a system prompt; if the deployment sends one, pass "
                        "--deployment-system-prompt TEXT so calibration sees the same tokens")
    return CalibrationSet([t for t in token_ids if t], warnings)


def _render(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> str:
    # A base model without a template is calibrated on the turns' plain text.
    return render_chat(tokenizer, messages, without_template=join_turns("\n"),
                       add_generation_prompt=messages[-1]["role"] != "assistant")
