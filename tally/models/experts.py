"""A mixture of experts in place of a layer's dense MLP: a router scores every expert per token, the top k run
on the rows that chose them, grouped by expert, and their outputs add up weighted by the router (its softmax over
every expert, or over the chosen ones: `Experts.routing`). In fp32 on native projections the whole MLP is one native
call (tally/models/native_experts.py)."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tally.layers.parallel import TPGroup
from tally.models.config import ModelConfig
from tally.models.native_experts import NativeExperts

ProjectionFactory = Callable[[list[str], bool], nn.Module]


class MixtureOfExperts(nn.Module):
    def __init__(self, cfg: ModelConfig, prefix: str, tensors: dict[str, torch.Tensor], make_proj: ProjectionFactory,
                 activation: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype,
                 tp: TPGroup | None = None) -> None:
        """`tp`: under tensor parallelism with partial sums each expert holds this rank's columns
        (tally/models/tensor_parallel.py), and the experts' weighted partial sums are all-reduced once; without,
        every rank holds the experts whole."""
        super().__init__()
        self.tp = tp if tp is not None and tp.partial_sums else None
        e = cfg.experts
        self.top_k, self.normalize, self.routing = e.top_k, e.normalize_top_k, e.routing
        # the router stays dense: a few thousand weights whose rounding would move which experts run
        self.router = nn.Parameter(tensors.pop(f"{prefix}.gate.weight").to(dtype), requires_grad=False)
        bias = tensors.pop(f"{prefix}.gate.bias").to(dtype) if e.bias else None
        self.router_bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        names = [f"{prefix}.experts.{i}" for i in range(e.num_experts)]
        self.gate_up = nn.ModuleList(make_proj([f"{n}.gate_proj", f"{n}.up_proj"], e.bias) for n in names)
        self.down = nn.ModuleList(make_proj([f"{n}.down_proj"], e.bias) for n in names)
        self.activation, self.activation_name = activation, cfg.activation
        self.swiglu = (cfg.swiglu_alpha, cfg.swiglu_limit)  # the native call's clamped SwiGLU (GPT-OSS)
        self.use_native = True  # benchmarks and tests turn it off to time or check the PyTorch loop
        self._native: NativeExperts | None = None
        self._native_built = False

    def native(self) -> NativeExperts | None:
        """The native call over these weights, or None. Built on first use: after loading has moved the weights
        where they stay (huge pages), since the call holds their addresses."""
        if not self._native_built:
            self._native, self._native_built = NativeExperts.build(self), True
        return self._native if self.use_native else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        native = self.native() if x.dtype == torch.float32 and x.dim() == 2 else None
        out = native(x.contiguous()) if native is not None else self._loop(x)
        return out if self.tp is None else self.tp.all_reduce(out)

    def _loop(self, x: torch.Tensor) -> torch.Tensor:
        # in float64 and rounded once: BLAS sums in an order that depends on the rows, and the router's logits pick
        # experts, so a row's routing would change with its batch; float64's rounding stays far below fp32's
        logits = F.linear(x.double(), self.router.double(),
                          None if self.router_bias is None else self.router_bias.double()).to(x.dtype)
        if self.routing == "top_k_softmax":
            top_logits, top_experts = torch.topk(logits, self.top_k, dim=-1)
            top_weights = torch.softmax(top_logits, dim=-1, dtype=torch.float32)
        else:
            weights = torch.softmax(logits, dim=-1, dtype=torch.float32)
            top_weights, top_experts = torch.topk(weights, self.top_k, dim=-1)
        if self.normalize:
            top_weights = top_weights / top_weights.sum(dim=-1, keepdim=True)
        top_weights = top_weights.to(x.dtype).view(-1)
        choices = top_experts.view(-1)
        order = torch.argsort(choices, stable=True)  # the (row, slot) choices grouped by expert, rows in order
        counts = torch.bincount(choices, minlength=len(self.down)).tolist()
        out = torch.zeros_like(x)
        start = 0
        for expert, count in enumerate(counts):
            if not count:
                continue
            picked = order[start:start + count]
            start += count
            rows = picked // self.top_k
            y = self.down[expert](self.activation(self.gate_up[expert](x[rows])))
            out.index_add_(0, rows, y * top_weights[picked, None])
        return out
