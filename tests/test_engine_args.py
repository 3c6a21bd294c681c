"""Engine flags are made from EngineConfig's fields: one name, default, choice list and help per option."""
from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from tally.core.scheduler import SchedulerConfig
from tally.engine.args import add_engine_args, config_from_args
from tally.engine.config import EngineConfig
from tally.errors import ConfigError


def _parse(*argv: str) -> EngineConfig:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    return config_from_args(p.parse_args(list(argv)))


def test_no_flags_give_the_dataclass_defaults():
    assert _parse() == EngineConfig()


def test_every_field_is_a_flag_with_help():
    p = argparse.ArgumentParser()
    add_engine_args(p)
    actions = {action.dest: action for action in p._actions}
    for f in fields(EngineConfig):
        assert "--" + f.name.replace("_", "-") in actions[f.name].option_strings
        assert actions[f.name].help


def test_flags_convert_to_the_field_types():
    cfg = _parse("--max-num-seqs", "4", "-q", "int4", "--no-enable-prefix-caching", "--kv-cache-memory", "2GiB",
                 "--kv-cache-memory-fraction", "0.5", "--max-model-len", "512")
    assert (cfg.max_num_seqs, cfg.quantization, cfg.enable_prefix_caching) == (4, "int4", False)
    assert cfg.kv_cache_memory == 2 * 2**30 and cfg.kv_cache_memory_fraction == 0.5 and cfg.max_model_len == 512


def test_choices_come_from_the_field():
    with pytest.raises(SystemExit):
        _parse("--attention-backend", "flash")
    with pytest.raises(ConfigError, match="attention_backend"):
        EngineConfig(attention_backend="flash")


def test_scheduler_defaults_are_the_engine_defaults():
    engine, scheduler = EngineConfig(), SchedulerConfig()
    for f in fields(SchedulerConfig):
        assert getattr(engine, f.name) == getattr(scheduler, f.name), f.name
