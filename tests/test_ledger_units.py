"""Sizes and rates are read with their units, decimal and binary kept apart."""
from __future__ import annotations

import pytest

from tally.errors import ConfigError
from tally.units import parse_bandwidth, parse_bytes, parse_flops


def test_decimal_and_binary_sizes_are_different_numbers():
    assert parse_bytes("80GB") == 80 * 10**9
    assert parse_bytes("80GiB") == 80 * 2**30
    assert parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes("1.5TB") == 1_500_000_000_000
    assert parse_bytes("4096") == 4096


def test_rates_are_decimal():
    assert parse_bandwidth("3.35TB/s") == pytest.approx(3.35e12)
    assert parse_bandwidth("900 GB/s") == pytest.approx(9e11)
    assert parse_flops("989T") == pytest.approx(989e12)
    assert parse_flops("312 TFLOP/s") == pytest.approx(312e12)


def test_unreadable_size_says_how_to_write_it():
    with pytest.raises(ConfigError, match="80GiB"):
        parse_bytes("eighty gigs")
    with pytest.raises(ConfigError, match="3.35TB/s"):
        parse_bandwidth("fast")
