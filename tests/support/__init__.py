"""Helpers the tests share: tiny checkpoints, engine checks, toy HTTP servers, reference int8 rounding."""
