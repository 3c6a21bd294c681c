"""Chat templates render as transformers renders them, byte for byte, and within bounds: `*` cannot build a huge
sequence (not even folded at compile time), and in a worker process a template that loops for hours, fills the
memory or writes without end fails alone with an error naming the limit, its worker replaced. A request's own
template renders at the lowest CPU priority, the model's at the server's."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from tally.errors import InvalidRequestError
from tally.models.chat_template import refuse_without_template, render_chat
from tally.models.loader import load_checkpoint
from tally.models.registry import resolve_model
from tally.models.template_sandbox import (
    MAX_REPEAT_ITEMS,
    TemplateJob,
    TemplateLimitError,
    TemplateRejected,
    render,
)
from tally.models.template_workers import TemplateLimits, TemplateWorkers
from tally.models.tokenizer import load_tokenizer
from tests.support.child_processes import worker_niceness

# Qwen2.5-Instruct's template: tools shown as JSON, tool calls and tool responses.
TOOLS_TEMPLATE = (Path(__file__).parent / "support" / "qwen2_5_chat_template.jinja").read_text()
# What else transformers gives templates: namespace, dict, loop controls, raise_exception, the generation block,
# the special tokens and the caller's variables.
GLOBALS_TEMPLATE = """{{ bos_token }}{% set ns = namespace(users=0) %}{% set d = dict(a=1, b=2) %}
{%- for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}
{%- if m.role == 'user' %}{% set ns.users = ns.users + 1 %}{% endif %}
{%- if m.role == 'assistant' %}{% generation %}[{{ m.content }}]{% endgeneration %}{% else %}{{ m.content }}{% endif %}
{%- if loop.index > 5 %}{% break %}{% endif %}{% endfor %}
{{ ns.users }} {{ d|tojson }} {{ dict.fromkeys(['x'])|tojson }} {{ enable_thinking|default(true) }} {{ '=' * 3 }}
{%- if messages|length > 9 %}{{ raise_exception('at most nine turns') }}{% endif %}"""
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, ° and ü",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the weather in Zürich? \u2028 <|im_end|>"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
    {"role": "tool", "content": '{"celsius": 21}', "tool_call_id": "call_1"},
    {"role": "assistant", "content": "It is 21 °C. "},
]
LIMITS = TemplateLimits(timeout_s=1.0, memory_bytes=2**29, max_output_chars=2**20)
BOMB = "{% set x = [0] * 50000000 %}{{ x|length }}"
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(load_checkpoint(str(resolve_model(None).path)))


@pytest.fixture(scope="module")
def workers():
    pool = TemplateWorkers(LIMITS, max_workers=2)
    yield pool
    pool.close()


def _ours(tokenizer, messages, **options) -> str:
    return render_chat(tokenizer, messages, without_template=refuse_without_template, **options)


def _transformers(tokenizer, messages, add_generation_prompt=True, continue_final_message=False,
                  template_kwargs=None, **options) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=continue_final_message,
                                         add_generation_prompt=add_generation_prompt and not continue_final_message,
                                         **options, **(template_kwargs or {}))


@pytest.mark.parametrize("case", ["builtin, one turn", "builtin, system and history", "builtin, continued",
                                  "tools template with tools", "tools template, no tools", "tools, continued",
                                  "globals and variables"])
def test_rendering_is_byte_identical_to_transformers(tokenizer, case):
    plain = [m for m in CONVERSATION if m["role"] in ("system", "user")] + [CONVERSATION[-1]]
    messages, options = {
        "builtin, one turn": ([{"role": "user", "content": "What is the capital of France?"}], {}),
        "builtin, system and history": (plain, {}),
        "builtin, continued": (plain, {"continue_final_message": True}),
        "tools template with tools": (CONVERSATION, {"chat_template": TOOLS_TEMPLATE, "tools": TOOLS}),
        "tools template, no tools": (CONVERSATION[1:], {"chat_template": TOOLS_TEMPLATE}),
        "tools, continued": (CONVERSATION, {"chat_template": TOOLS_TEMPLATE, "tools": TOOLS,
                                            "continue_final_message": True}),
        "globals and variables": (CONVERSATION, {"chat_template": GLOBALS_TEMPLATE,
                                                 "template_kwargs": {"enable_thinking": False}}),
    }[case]
    ours = _ours(tokenizer, messages, **options)
    assert ours == _transformers(tokenizer, messages, **options)
    assert ours  # a real rendering, not two empty strings


def test_a_worker_renders_what_this_process_renders(tokenizer, workers):
    options = {"chat_template": TOOLS_TEMPLATE, "tools": TOOLS}
    assert _ours(tokenizer, CONVERSATION, renderer=workers.render, **options) == _ours(tokenizer, CONVERSATION,
                                                                                       **options)


def test_a_templates_own_error_is_a_400_naming_the_messages(tokenizer, workers):
    with pytest.raises(InvalidRequestError, match="at most nine turns") as err:
        _ours(tokenizer, CONVERSATION * 2, chat_template=GLOBALS_TEMPLATE, renderer=workers.render)
    assert err.value.param == "messages"


def test_repeating_a_sequence_past_the_limit_fails_before_allocating_it():
    for template in (BOMB, "{{ 'ab' * 600000 }}", "{{ 2000000 * [1] }}"):
        with pytest.raises(TemplateLimitError, match=f"{MAX_REPEAT_ITEMS:,}"):
            render(TemplateJob(template, []))
    assert render(TemplateJob("{{ '-' * 8 }}{{ [0] * 2 }}", [])) == "--------[0, 0]"


def test_the_bounds_are_400s_that_name_the_limit(tokenizer, workers):
    chat = [{"role": "user", "content": "hi"}]
    for template, limit in ((BOMB, "1,000,000"), (NESTED_LOOPS, "1 s"), ("{{ 'x' * 999999 }}" * 2, "characters")):
        with pytest.raises(InvalidRequestError, match=limit) as err:
            _ours(tokenizer, chat, chat_template=template, renderer=workers.render)
        assert err.value.param == "chat_template"
    assert _ours(tokenizer, chat, renderer=workers.render).endswith("<|im_start|>assistant\n")


def test_the_memory_bound_is_a_400_that_names_it(tokenizer):
    # a deadline long enough that a loaded machine reaches the memory limit first
    pool = TemplateWorkers(replace(LIMITS, timeout_s=60.0), max_workers=1)
    try:
        with pytest.raises(InvalidRequestError, match="GiB of memory") as err:
            _ours(tokenizer, [{"role": "user", "content": "hi"}], renderer=pool.render,
                  chat_template="{% set s = 'a' * 999999 %}" + "{% set s = s + s %}" * 12)
        assert err.value.param == "chat_template"
    finally:
        pool.close()


def test_a_worker_over_its_deadline_is_killed_and_replaced(workers):
    job = TemplateJob(NESTED_LOOPS, [])
    with pytest.raises(TemplateLimitError):
        workers.render(job)
    with pytest.raises(TemplateRejected, match="boom"):
        workers.render(TemplateJob("{{ raise_exception('boom') }}", []))
    assert workers.render(TemplateJob("{{ messages[0].content }}", [{"content": "still here"}])) == "still here"


def test_a_requests_own_template_renders_at_the_lowest_priority_the_models_at_the_servers():
    def new_workers_niceness(limits: TemplateLimits) -> list[int]:
        before = worker_niceness(os.getpid(), TemplateWorkers.__module__)
        pool = TemplateWorkers(limits, max_workers=1)
        try:
            assert pool.render(TemplateJob("{{ messages[0].content }}", [{"content": "hi"}])) == "hi"
            after = worker_niceness(os.getpid(), TemplateWorkers.__module__)
            return [n for pid, n in after.items() if pid not in before]
        finally:
            pool.close()

    assert new_workers_niceness(LIMITS) == [os.getpriority(os.PRIO_PROCESS, 0)]
    assert new_workers_niceness(LIMITS.for_requests()) == [19]
