"""bf16 matmuls see a bounded set of row counts: oneDNN compiles and keeps a kernel of about a megabyte per shape,
so without buckets a server whose steps take every row count grows for hours (docs/benchmarks.md#reliability)."""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from tally.layers.dense import DenseLinear
from tally.quant.base import bucketed_rows, tiled_matmul


class RowsSeen(TorchFunctionMode):
    """The row counts that reach a matmul or a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: set[int] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.matmul, torch.Tensor.__matmul__, torch.nn.functional.linear):
            self.rows.add(args[0].shape[0])
        return func(*args, **(kwargs or {}))


def test_buckets_cover_every_row_count_with_at_most_an_eighth_more():
    sizes = [bucketed_rows(m) for m in range(1, 8193)]
    assert all(b >= m for m, b in zip(range(1, 8193), sizes))
    assert all(b <= m * 1.125 for m, b in zip(range(17, 8193), sizes[16:]))
    assert len(set(sizes)) <= 80 and sizes == sorted(sizes)


def test_a_bf16_layer_meets_few_shapes_and_keeps_each_rows_result():
    torch.manual_seed(0)
    weight = torch.randn(96, 64)
    dense = DenseLinear(weight, torch.randn(96), torch.bfloat16)
    tiles = lambda n0, n1: weight[n0:n1].to(torch.bfloat16).t()  # noqa: E731 - one tile callback
    inputs = [torch.randn(m, 64) for m in range(1, 301)]
    with RowsSeen() as seen:
        for x in inputs:
            assert dense(x.to(torch.bfloat16)).shape == (x.shape[0], 96)
            assert tiled_matmul(x, 96, torch.bfloat16, tiles).shape == (x.shape[0], 96)
    assert len(seen.rows) <= 40  # 300 row counts
    x = inputs[99]
    alone = x.to(torch.bfloat16) @ tiles(0, 96)
    torch.testing.assert_close(tiled_matmul(x, 96, torch.bfloat16, tiles), alone)
