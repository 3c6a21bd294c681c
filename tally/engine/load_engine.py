"""The engine a checkpoint needs: an encoder (BERT, XLM-R) gets tally/engine/encoder_engine.py, anything else the
generation engine (tally/engine/engine.py), which also pools decoder embeddings."""
from __future__ import annotations

from tally.engine.config import EngineConfig
from tally.engine.encoder_engine import EncoderEngine
from tally.engine.engine import Engine
from tally.models.encoders.config import read_encoder_config
from tally.models.registry import resolve_model


def load_engine(config: EngineConfig) -> Engine | EncoderEngine:
    encoder = read_encoder_config(resolve_model(config.model).path)
    return Engine(config) if encoder is None else EncoderEngine(config, encoder)
