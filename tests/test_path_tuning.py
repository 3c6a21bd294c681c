"""The projection path chosen by measurement (tally/engine/startup/path_tuning.py): what is measured, how it is decided,
the disk cache, the bf16 many-token path it may turn on, and GGUF served as stored by default."""
from __future__ import annotations

import json

import pytest
import torch

from tally import LLM, SamplingParams
from tally.cli import main as tally_main
from tally.engine.config import EngineConfig, PathCandidate
from tally.engine.startup.path_tuning import ROWS, PathChoice, _decide, choose_path
from tally.layers.dense import Fp16WeightLinear
from tally.layers.path_timing import PathTimes, ProjectionShape
from tally.native import ops
from tally.platform import has_fast_bf16
from tally.quant.native_linear import NativeInt4Linear, NativeInt8Linear
from tally.quant.rtn import quantize_int4_groupwise, quantize_int8_per_channel

needs_native = pytest.mark.skipif(not ops.available(), reason="the native kernels need AVX2 and a C compiler")


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the path cache (and a fresh kernel build) live here
    return tmp_path / "tally"


def test_the_path_fastest_at_one_row_wins_and_bf16_takes_rows_from_where_it_wins_for_good():
    a, b = PathCandidate("float16", "gguf"), PathCandidate("bfloat16", "gguf")
    measured = {a.label: PathTimes({1: 1.0, 8: 2.0, 32: 4.0, 128: 10.0, 512: 40.0},
                               {8: 3.0, 32: 3.5, 128: 5.0, 512: 9.0}),
                b.label: PathTimes({1: 3.0, 8: 3.0, 32: 3.0, 128: 6.0, 512: 9.0})}
    choice = _decide([a, b], measured)
    assert choice.candidate == a and choice.many_tokens_from == 32
    # a win at 8 rows that is lost again at 32 does not count: bf16 must stay ahead from its start on
    measured[a.label].bf16_many = {8: 1.0, 32: 5.0, 128: 5.0, 512: 9.0}
    assert _decide([a, b], measured).many_tokens_from == 128
    # nor does one within the measurement's noise (BF16_MARGIN): 3.9 against 4.0 at 32 rows
    measured[a.label].bf16_many = {8: 3.0, 32: 3.9, 128: 5.0, 512: 9.0}
    assert _decide([a, b], measured).many_tokens_from == 128
    measured[a.label].bf16_many = {8: 9.0, 32: 9.0, 128: 19.0, 512: 41.0}
    assert _decide([a, b], measured).many_tokens_from is None
    measured[b.label].own[1] = 0.5
    assert _decide([a, b], measured).candidate == b


def test_explicit_dtype_and_fp32_checkpoints_are_not_measured():
    def candidates(dtype: str, **kw):
        return EngineConfig(dtype=dtype, **kw).path_candidates("bfloat16", is_gguf=False, prequantized=False)

    panels = ops.available()  # fp32 on the native panels where they build (row-independent sums)
    assert candidates("float32") == ([PathCandidate("float32", None, panels=panels)], False)
    assert candidates("half", quantization="int4") == ([PathCandidate("float16", "int4")], False)
    bf16 = candidates("bfloat16")  # bf16 panels: oneDNN's bf16 kernels follow the row count on CPUs with bf16
    assert bf16 == ([PathCandidate("bfloat16", None, panels=panels)], False)
    assert bf16[0][0].dtypes == (torch.bfloat16, torch.bfloat16 if panels else None)
    assert candidates("bfloat16", batch_invariant=False) == ([PathCandidate("bfloat16", None)], False)
    fp32 = EngineConfig().path_candidates("float32", is_gguf=False, prequantized=False)
    assert fp32 == ([PathCandidate("float32", None, panels=panels)], False)
    blas = EngineConfig(batch_invariant=False).path_candidates("float32", is_gguf=False, prequantized=False)
    assert blas == ([PathCandidate("float32", None)], False) and blas[0][0].dtypes == (torch.float32, None)
    gguf, open_choice = EngineConfig().path_candidates("float32", is_gguf=True, prequantized=False)
    assert {c.quantization for c in gguf} == {"gguf"}  # as stored, by default
    assert open_choice == (not has_fast_bf16())  # batch invariance holds a CPU with bf16 instructions to fp32 compute
    dequantized, _ = EngineConfig(quantization="none").path_candidates("float32", is_gguf=True, prequantized=False)
    assert {c.quantization for c in dequantized} == {None}


def test_bf16_paths_are_measured_only_when_batch_invariance_is_off(monkeypatch):
    """On a CPU with fast bf16, oneDNN's bf16 matmul would make a row's bits depend on its batch: by default the fp32
    path serves unmeasured; --no-batch-invariant lets start-up measure bf16 too."""
    monkeypatch.setattr("tally.engine.config.has_fast_bf16", lambda: True)
    for prequantized in (False, True):
        only, open_choice = EngineConfig().path_candidates("bfloat16", is_gguf=False, prequantized=prequantized)
        assert [c.dtypes[0] for c in only] == [torch.float32] and not open_choice
    both, open_choice = EngineConfig(batch_invariant=False).path_candidates("bfloat16", is_gguf=False,
                                                                           prequantized=False)
    assert torch.bfloat16 in [c.dtypes[0] for c in both] and open_choice


def test_the_measurement_is_cached_by_machine_and_shapes_and_measured_again_when_asked(cache_home):
    shapes = {"": [ProjectionShape("qkv", 96, 64, 2, "dense"), ProjectionShape("o", 64, 64, 2, "dense"),
                   ProjectionShape("lm_head", 256, 64, 1, "dense", decode_only=True)]}
    candidates = [PathCandidate("float32", None), PathCandidate("bfloat16", None)]
    first = choose_path(candidates, shapes)
    assert first.measured and not first.cache_hit and first.seconds > 0
    assert set(first.times) == {c.label for c in candidates}
    # every candidate at one row; the one that won there at every row count
    assert all(1 in t.own for t in first.times.values()) and set(first.times[first.candidate.label].own) == set(ROWS)
    files = list((cache_home / "paths").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["path"] == first.candidate.label
    again = choose_path(candidates, shapes)
    assert again.cache_hit and again.candidate == first.candidate and again.seconds == 0.0
    assert again.many_tokens_from == first.many_tokens_from and again.times.keys() == first.times.keys()
    other = {"": [ProjectionShape("qkv", 96, 64, 3, "dense"), *shapes[""][1:]]}
    assert not choose_path(candidates, other).cache_hit  # other shapes: another key
    assert not choose_path(candidates, shapes, remeasure=True).cache_hit
    files[0].write_text("{not json")  # a damaged file is measured over, not trusted
    assert not choose_path(candidates, shapes).cache_hit


def test_builtin_gguf_is_served_as_stored_and_the_ledger_says_how(cache_home):
    llm = LLM(None, max_model_len=256, kv_cache_memory=16_000_000)
    path = llm.engine.ledger.path
    assert path["quantization"] == "gguf" and path["summary"] in llm.engine.ledger.format()
    assert not isinstance(llm.engine.model.layers[0].down_proj, torch.nn.Linear)
    dense = LLM(None, quantization="none", max_model_len=256, kv_cache_memory=16_000_000)
    assert dense.engine.ledger.path["quantization"] is None
    assert llm.engine.ledger.weight_bytes < 0.6 * dense.engine.ledger.weight_bytes
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4))[0]
    assert len(out.outputs[0].token_ids) == 4
    restart = LLM(None, max_model_len=256, kv_cache_memory=16_000_000).engine.ledger.path
    assert restart["cache_hit"] == path["measured"] and restart["path"] == path["path"]


def test_tally_tune_measures_again_and_prints_the_choice(cache_home, capsys):
    assert tally_main(["tune", "--max-model-len", "256"]) == 0
    printed = capsys.readouterr().out
    assert "chosen: gguf" in printed


def _reference_many_tokens(layer: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor) -> None:
    """The bf16 many-token path equals a bf16 matmul over the layer's own weights, rounded once to bf16."""
    ref = (x.bfloat16() @ weight.bfloat16().t()).float()
    layer.use_many_tokens(1, torch.bfloat16)
    got = layer(x)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert ((got - ref).abs().max() / ref.abs().max()).item() < 2e-2


@needs_native
def test_native_layers_many_token_path_is_a_bf16_matmul_over_their_stored_weights():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(40, 128, generator=gen)  # 40 outputs: whole 8-output tiles, and fp16 panels with padding
    x = torch.randn(9, 128, generator=gen)
    q, scale, zero = quantize_int4_groupwise(w, 32, scale_dtype=torch.float32)
    int4 = NativeInt4Linear.from_q(q, scale, zero, 32, None)
    deq4 = ((q.float() - 8).view(40, 4, 32) * scale[:, :, None] + zero[:, :, None]).view(40, 128)
    _reference_many_tokens(int4, x, deq4)
    q6 = torch.randint(0, 64, (40, 128), dtype=torch.uint8, generator=gen)
    d6 = torch.rand(40, 8, generator=gen) * 0.02
    int6 = NativeInt4Linear(q6, d6, None, 16, None, bits=6)
    _reference_many_tokens(int6, x, ((q6.float() - 32).view(40, 8, 16) * d6[:, :, None]).view(40, 128))
    q8, s8 = quantize_int8_per_channel(w, scale_dtype=torch.float32)
    int8 = NativeInt8Linear(q8, s8.reshape(-1, 1), None)
    _reference_many_tokens(int8, x, q8.float() * s8[:, None])
    panels = Fp16WeightLinear(w, torch.randn(40, generator=gen))
    ref_bias = panels.bias.clone()
    panels.use_many_tokens(4)
    got = panels(x)
    ref = (x.bfloat16() @ w.half().bfloat16().t()).float() + ref_bias
    assert ((got - ref).abs().max() / ref.abs().max()).item() < 2e-2
    assert torch.equal(panels(x[:3]), ops.gemm_f16(x[:3].contiguous(), panels.panels, 40, ref_bias))  # few rows


@needs_native
def test_dequantizing_kernels_round_the_stored_weights_to_bf16():
    gen = torch.Generator().manual_seed(1)
    q = torch.randint(0, 16, (24, 64), dtype=torch.uint8, generator=gen)
    d, m = torch.rand(24, 2, generator=gen), torch.randn(24, 2, generator=gen)
    want = (q.float().view(24, 2, 32) * d[:, :, None] + m[:, :, None]).view(24, 64)
    got = ops.dequant_q4_bf16(ops.pack_q4(q), ops.pack_tile_scales(d), ops.pack_tile_scales(m), 32).float()
    # within one bf16 step: the kernel fuses q * d + m (one rounding to fp32 fewer than the reference)
    assert ((got - want).abs() <= want.abs() * 2**-7).all()
    for bits, group in ((5, 32), (6, 16)):
        q = torch.randint(0, 1 << bits, (24, 64), dtype=torch.uint8, generator=gen)
        s = torch.rand(24, 64 // group, generator=gen)
        want = ((q.float() - (1 << (bits - 1))).view(24, -1, group) * s[:, :, None]).view(24, 64)
        qs, qh = ops.pack_planes(q, bits)
        got = ops.dequant_q4_bf16(qs, ops.pack_tile_scales(s), None, group, qh=qh).float()
        assert ((got - want).abs() <= want.abs() * 2**-7).all()
    # GGUF Q4_K / Q6_K scales held as their factors (int_dots.h: GroupValues, form P): the bits of fp32 copies
    base, mins = torch.rand(24, 1, generator=gen).half().float(), -torch.rand(24, 1, generator=gen).half().float()
    for bits, group in ((4, 32), (6, 16)):
        q = torch.randint(0, 1 << bits, (24, 256), dtype=torch.uint8, generator=gen)
        steps = [torch.randint(0, 64, (24, 256 // group), generator=gen) for _ in range(2)]
        qs, qh = (ops.pack_q4(q), None) if bits == 4 else ops.pack_planes(q, bits)
        factored = [ops.pack_tile_factors(b, s) for b, s in zip((base, mins), steps)]
        plain = [ops.pack_tile_scales(b.repeat_interleave(256 // group, 1) * s.float())
                 for b, s in zip((base, mins), steps)]
        if bits == 6:  # no minima: w = d * (q - 32)
            factored[1] = plain[1] = None
        assert torch.equal(ops.dequant_q4_bf16(qs, *factored, group, qh=qh),
                           ops.dequant_q4_bf16(qs, *plain, group, qh=qh))
    q8 = torch.randint(-127, 128, (24, 64), dtype=torch.int8, generator=gen)
    s = torch.rand(24, 2, generator=gen)
    want8 = (q8.float().view(24, 2, 32) * s[:, :, None]).view(24, 64).bfloat16().float()
    assert torch.equal(ops.dequant_q8_bf16(ops.pack_q8(q8), ops.pack_tile_scales(s), 32).float(), want8)
    w = torch.randn(40, 64, generator=gen)
    w_t = ops.dequant_f16_bf16_t(ops.pack_f16(w))
    assert torch.equal(w_t[:, :40].float(), w.half().bfloat16().float().t())


def test_a_choice_read_back_says_so_in_its_summary():
    choice = PathChoice(PathCandidate("float16", "gguf"), 128, {"x": PathTimes({r: 1.0 for r in ROWS})},
                        cache_hit=True)
    assert "rows ≥ 128 in bf16" in choice.summary() and "cached" in choice.summary()
    assert "not measured" in PathChoice(PathCandidate("float32", None)).summary()


def test_cpu_affinity_pins_the_engine_and_its_threads_follow(tmp_path, tiny_llama):
    import os

    from tally.errors import ConfigError
    from tally.platform import parse_cpu_list, pin_process

    assert parse_cpu_list("0-2,5") == {0, 1, 2, 5}
    for bad in ("2-1", "a", "0-", "99999"):
        with pytest.raises(ConfigError):
            EngineConfig(cpu_affinity=bad)
    before, threads = os.sched_getaffinity(0), torch.get_num_threads()
    try:
        llm = LLM(str(tiny_llama), cpu_affinity="0", kv_cache_memory=2_000_000)
        assert os.sched_getaffinity(0) == {0} and torch.get_num_threads() == 1
        assert len(llm.generate("hi", SamplingParams(max_tokens=2))[0].outputs[0].token_ids) == 2
    finally:  # the rest of the session's tests run on every CPU again
        pin_process(before)
        torch.set_num_threads(threads)
