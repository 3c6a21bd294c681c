"""GPTQ (Frantar et al. 2022): quantize a weight column by column, pushing each column's rounding error onto the
columns not yet quantized in the direction the calibration Hessian H = 2 X^T X / n says costs least.

The standard algorithm: damp H by 1% of its mean diagonal, take the upper Cholesky factor of H^-1, quantize in
blocks of 128 columns with lazy batch updates. int4 groups take their scale and zero from the error-updated
columns when the group's first column is reached (as the reference does); with act-order (columns in decreasing
diag(H)) the groups' grids are fixed up front from the original weight instead, so groups stay contiguous in the
stored layout (no g_idx). int8 per-channel scales are fixed up front.
"""
from __future__ import annotations

import torch

from tally.quantize.scheme import Grid, QuantScheme, fit_grid

BLOCK_COLUMNS = 128  # a multiple of every int4 group size, so a group never straddles two blocks
DAMP_FRACTION = 0.01


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, scheme: QuantScheme, *,
                  act_order: bool = False) -> tuple[torch.Tensor, Grid]:
    """weight [N, K], hessian [K, K] → (integers q [N, K] as fp32 on the returned grid, grid)."""
    w = weight.float().clone()
    n_cols = w.shape[1]
    h = hessian.float().clone()
    dead = torch.diag(h) == 0  # channels never active: any value works, zero keeps them harmless
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    grid = fit_grid(w, scheme)
    refit = scheme.bits == 4 and not act_order
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(n_cols)
    w, h = w[:, perm], h[perm][:, perm]
    h.diagonal().add_(DAMP_FRACTION * torch.mean(torch.diag(h)))
    h_inv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)

    q = torch.zeros_like(w)
    for b0 in range(0, n_cols, BLOCK_COLUMNS):
        b1 = min(b0 + BLOCK_COLUMNS, n_cols)
        w_block, err_block, h_block = w[:, b0:b1].clone(), torch.zeros(w.shape[0], b1 - b0), h_inv[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = b0 + i
            orig = int(perm[col])
            if refit and orig % grid.group_size == 0:
                grid.refit_group(w_block[:, i:i + grid.group_size], orig // grid.group_size, scheme)
            column = w_block[:, i:i + 1]
            q[:, col:col + 1] = grid.quantize(column, orig)
            err = (column - grid.dequantize(q[:, col:col + 1], orig)) / h_block[i, i]
            w_block[:, i:] -= err @ h_block[i:i + 1, i:]
            err_block[:, i:i + 1] = err
        w[:, b1:] -= err_block @ h_inv[b0:b1, b1:]
    return q[:, torch.argsort(perm)], grid
