"""The flags that shape answers, which `tally serve` and `tally run-batch` share: chat template, tool calls and
reasoning. One definition each, checked once, so a batch file is answered as the server would answer it."""
from __future__ import annotations

import argparse
from pathlib import Path

from tally.errors import ConfigError
from tally.flags import Flag
from tally.server.reasoning import REASONING_PARSERS, reasoning_parser
from tally.server.tools import TOOL_CALL_PARSERS

CHAT_TEMPLATE = Flag("chat_template", "a Jinja chat template (a file, or the template itself) used instead of the "
                                      "model's", metavar="FILE_OR_TEXT", none_means="the model's")
ENABLE_AUTO_TOOL_CHOICE = Flag("enable_auto_tool_choice", 'let the model decide to call tools (tool_choice "auto"); '
                                                          "needs --tool-call-parser", action="store_true")
TOOL_CALL_PARSER = Flag("tool_call_parser", "how calls are read from the model's text: hermes (Hermes, Qwen2.5: "
                                            "<tool_call> JSON), llama3_json (Llama 3's JSON)",
                        choices=tuple(TOOL_CALL_PARSERS), none_means="none")
REASONING_PARSER = Flag("reasoning_parser", f"return a reasoning model's thinking apart from its answer "
                                            f"({' | '.join(REASONING_PARSERS)}): deepseek_r1 (text before </think> is "
                                            "thinking), qwen3 (<think>...</think>), mistral ([THINK]...[/THINK]), or "
                                            "any pair of tags", metavar="NAME", none_means="none")


def add_answer_flags(p: argparse.ArgumentParser) -> None:
    for flag in (CHAT_TEMPLATE, ENABLE_AUTO_TOOL_CHOICE, TOOL_CALL_PARSER, REASONING_PARSER):
        flag.add(p)


def check_answer_flags(p: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Exits with a usage error naming what to change; reads a --chat-template file into its text."""
    if ns.enable_auto_tool_choice and ns.tool_call_parser is None:
        p.error(f"--enable-auto-tool-choice needs --tool-call-parser ({' | '.join(TOOL_CALL_PARSERS)})")
    if ns.reasoning_parser is not None:
        try:
            reasoning_parser(ns.reasoning_parser)
        except ConfigError as e:
            p.error(f"--reasoning-parser: {e.message}")
    if ns.chat_template is not None and _is_file(ns.chat_template):
        ns.chat_template = Path(ns.chat_template).read_text()


def _is_file(path_or_text: str) -> bool:
    try:
        return Path(path_or_text).is_file()
    except OSError:  # a template's text longer than a file name may be
        return False
