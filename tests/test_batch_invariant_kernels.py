"""Every native kernel a step's rows pass through gives a row the bits it gets alone, whatever the number of rows
called with it (1 to 256), on every build of the kernels this CPU runs: the ground under the needle tests of
tests/test_batch_invariance.py."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tally.native import library, ops

pytestmark = pytest.mark.skipif(not ops.available(), reason="native kernels unavailable (see tally/native/library.py)")

ROWS = 256
# every count up to three micro-tiles, then around the 66-row passes of the fp16 panels and the integer kernels' 64
COUNTS = [*range(2, 20), 31, 63, 64, 65, 66, 67, 68, 70, 127, 128, 131, 132, 133, 200, 255]
gen = torch.Generator().manual_seed(57)


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def _kernels() -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Each row-wise kernel on fixed weights, x [M, K] -> [M, ...]. N = 72 outputs: an odd number of 16-output
    panels (the last partial) and of 8-output tiles; K = 96."""
    n, k = 72, 96
    panels, bias = ops.pack_f16(rand(n, k)), rand(n)
    panels32 = ops.pack_f16(rand(n, k), torch.float32)
    panels_bf16 = ops.pack_f16(rand(n, k), torch.bfloat16)
    q4 = ops.pack_q4(torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen))
    d, m = ops.pack_tile_scales(rand(n, k // 32).abs()), ops.pack_tile_scales(rand(n, k // 32))
    q6, qh6 = ops.pack_planes(torch.randint(0, 64, (n, k), dtype=torch.uint8, generator=gen), 6)
    d16 = ops.pack_tile_scales(rand(n, k // 16).abs())
    q8 = ops.pack_q8(torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen))
    s8 = ops.pack_tile_scales(rand(n, 1).abs())
    norm_w = rand(k)
    return {
        "gemm_f16": lambda x: ops.gemm_f16(x, panels, n, bias),
        "gemm_f32": lambda x: ops.gemm_f32(x, panels32, n, bias),
        "gemm_bf16": lambda x: ops.gemm_bf16(x, panels_bf16, n, bias),
        "gemm_q4": lambda x: ops.gemm_q4(x, q4, d, m, bias, 32, n),
        "gemm_q6": lambda x: ops.gemm_q4(x, q6, d16, None, None, 16, n, qh=qh6),
        "gemm_q8": lambda x: ops.gemm_q8(x, q8, s8, None, k, n),
        "gemm_w8a8": lambda x: ops.gemm_q8(x, q8, s8, None, k, n, per_token=True),
        "rms_norm": lambda x: ops.rms_norm(x, norm_w, 1e-6),
        "logsumexp": lambda x: ops.logsumexp_rows(x),  # the rows stand for logits over a vocabulary of K
        "top_k": lambda x: torch.cat([t.reshape(x.shape[0], -1).float() for t in ops.top_rows(x, 5)], 1),
    }


@pytest.mark.parametrize("build", list(library.builds()))
def test_each_row_gets_its_bits_alone_at_every_row_count_on_every_build(build: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    lib = library.load_build(library.builds()[build])
    monkeypatch.setattr(ops, "load", lambda: lib)
    x = rand(ROWS, 96)
    for name, kernel in _kernels().items():
        together = kernel(x)
        alone = torch.cat([kernel(x[r:r + 1]) for r in range(0, ROWS, 7)])
        assert torch.equal(alone, together[::7]), f"{name} ({build}): a row alone differs from it among {ROWS}"
        for rows in COUNTS:
            assert torch.equal(kernel(x[:rows]), together[:rows]), f"{name} ({build}) at {rows} rows"


def test_sampling_a_row_draws_the_same_token_in_any_batch() -> None:
    """The sampler's kernel reads a row's logits and its own uniform draw only (the engine draws u per request from
    the request's generator: tests/test_batch_invariance.py checks seeded requests end to end)."""
    logits, u = rand(ROWS, 300), torch.rand(ROWS, dtype=torch.float64, generator=gen)
    together = ops.sample_rows(logits, u)
    for rows in (1, 2, 7, 64, 255):
        assert torch.equal(ops.sample_rows(logits[:rows], u[:rows]), together[:rows])
    assert torch.equal(torch.cat([ops.sample_rows(logits[r:r + 1], u[r:r + 1]) for r in range(ROWS)]), together)


def test_bf16_panels_give_the_fp32_panels_bits_of_the_same_weights() -> None:
    """bf16 widens to fp32 exactly (a shift), and both read their panels in one order: the bf16 kernel is the fp32
    one over the same values, at every row count the tiles take."""
    w, bias = rand(40, 64).bfloat16(), rand(40)
    bf16, fp32 = ops.pack_f16(w, torch.bfloat16), ops.pack_f16(w.float(), torch.float32)
    for rows in (1, 2, 3, 7, 66, 70):
        x = rand(rows, 64)
        assert torch.equal(ops.gemm_bf16(x, bf16, 40, bias), ops.gemm_f32(x, fp32, 40, bias))
