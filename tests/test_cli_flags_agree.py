"""The verbs agree with each other: an option that several verbs take is one definition (tally/flags.py), with the
same dest, type and choices wherever it appears (`--kv-cache-dtype`, `--max-num-batched-tokens`, `--dtype`, `--out`,
`--json` ...), and every option of every verb has help text that shows its default."""
from __future__ import annotations

import argparse
import importlib
from collections import defaultdict

import pytest

from tally.cli import VERBS
from tally.flags import DTYPE, KV_CACHE_DTYPE, QUANTIZATION

# Each verb's parser; `tally serve` parses in the server (tally/deploy/serve_cli.py only routes --ray), and
# `tally bench compare` is a verb of its own inside bench.
PARSER_MODULES = {**{verb: module for verb, (module, _) in VERBS.items()}, "serve": "tally.server.cli",
                  "bench compare": "tally.bench.run_diff"}

# Names two verbs use for different things, each as the tool people know it uses the name. Everything else that
# two verbs share must be one definition.
HOMONYMS = {
    "--model": {"bench": "the served name to request, as vLLM's benchmark --model",
                "plan": "also a config.json or a preset, priced without weights",
                "deploy": "also a preset, to size pods for a model served from a volume"},
    "--seed": {"bench": "the workload's seed (lengths, prompts, arrivals), as vLLM's benchmark --seed"},
    "--lengths": {"plan": "observed lengths to plan for (a trace or a bench result)",
                  "bench": "a length sampler to send (lognormal:..., fixed:..., trace:FILE)"},
    "--reserve": {"plan": "a share or a size of a device's memory", "deploy": "a pod's bytes beside weights and KV"},
    "--baseline": {"eval": "the baseline model", "alerts": "the baseline run"},
    "--canary": {"route": "the canary replicas' URLs", "deploy": "the canary pods' tally serve flags"},
    "--device": {"serve": "vLLM's --device, accepted and ignored (no effect on CPU)", "plan": "the device planned for"},
    "--api-key": {"serve": "the key clients must send", "bench": "the key it sends"},
    "--plan": {"route": "the canary's weights and holds", "deploy": "a `tally plan --out` result: its length pools"},
    "--rules": {"eval": "a user suite's GO/NO-GO thresholds on scores", "route": "the canary's rollback rules"},
}


def build(verb: str) -> argparse.ArgumentParser:
    p = importlib.import_module(PARSER_MODULES[verb]).build_parser()
    if verb == "deploy":  # tally deploy k8s: the target's parser holds the options
        p = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices["k8s"]
    return p


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    return {verb: build(verb) for verb in PARSER_MODULES}


def options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_every_verb_has_a_parser_to_check():
    assert set(VERBS) <= set(PARSER_MODULES)


def test_an_option_two_verbs_take_is_one_definition(parsers):
    by_name: dict[str, list[tuple[str, argparse.Action]]] = defaultdict(list)
    for verb, p in parsers.items():
        for action in options(p):
            for name in action.option_strings:
                if verb not in HOMONYMS.get(name, {}):
                    by_name[name].append((verb, action))
    shared = {name: found for name, found in by_name.items() if len({verb for verb, _ in found}) > 1}
    assert {"--dtype", "--kv-cache-dtype", "--max-num-batched-tokens", "--max-model-len", "--out", "--json",
            "--tensor-parallel-size", "--metrics-prefix"} <= set(shared)
    for name, found in shared.items():
        flags = {verb: getattr(action, "flag", None) for verb, action in found}
        assert None not in flags.values(), f"{name}: defined by hand in {[v for v, f in flags.items() if f is None]}"
        assert len(set(flags.values())) == 1, f"{name}: more than one definition"
        assert len({(a.dest, a.type, a.choices, a.nargs, type(a)) for _, a in found}) == 1, name


@pytest.mark.parametrize("verb", sorted(PARSER_MODULES))
def test_every_option_has_help_that_shows_its_default(parsers, verb):
    p = parsers[verb]
    formatter = p._get_formatter()
    for action in options(p):
        text = formatter._expand_help(action) if action.help else ""
        assert text.strip(), f"tally {verb} {action.option_strings[-1]}: no help"
        default = action.default
        if default is not None and default is not False and default != []:
            assert str(default) in text, f"tally {verb} {action.option_strings[-1]}: default {default!r} not shown"


def test_per_model_options_of_eval_take_the_shared_choices(parsers):
    eval_options = {a.dest: a for a in options(parsers["eval"])}
    for who in ("baseline", "candidate"):
        assert eval_options[f"{who}_kv_cache_dtype"].choices == KV_CACHE_DTYPE.choices
        assert eval_options[f"{who}_quantization"].choices == QUANTIZATION.choices


@pytest.mark.parametrize("verb", ["serve", "generate", "plan", "eval", "deploy"])
def test_a_dtype_means_the_same_in_every_verb(parsers, verb):
    """vLLM's spellings (half, float) and the short ones read as one name wherever --dtype and --kv-cache-dtype are
    taken, so a command line moves between verbs unchanged."""
    p = parsers[verb]
    required = {"generate": ["--prompt", "hi"]}.get(verb, []) + (["--model", "m"] if verb == "plan" else [])
    ns = p.parse_args([*required, "--dtype", "half", "--kv-cache-dtype", "bf16"]
                      if verb != "eval" else ["--dtype", "half", "--candidate-kv-cache-dtype", "bf16"])
    assert ns.dtype == "float16" and DTYPE.choices == ("auto", "float32", "bfloat16", "float16")
    assert (ns.candidate_kv_cache_dtype if verb == "eval" else ns.kv_cache_dtype) == "bfloat16"
    with pytest.raises(SystemExit):
        p.parse_args([*required, "--dtype", "float64"])


def test_help_never_shows_an_api_key_from_the_environment(parsers, monkeypatch):
    monkeypatch.setenv("TALLY_API_KEY", "sekrit")
    monkeypatch.setenv("OPENAI_API_KEY", "sekrit")
    for verb in ("serve", "bench"):
        assert "sekrit" not in build(verb).format_help()
