"""Dense weight formats on this CPU, as a decode step meets them: every projection of the model once, in layer
order (so weights stream from memory, not from cache), for a few row counts.

  fp32       F.linear on fp32 weights (Tally's dtype=float32)
  fp16w      FBGEMM's packed fp16 GEMM, fp32 in/out (Tally's dtype=float16 where the native kernels are unavailable)
  f16-nat    Tally's native fp16 panels, fp32 in/out (dtype=float16 / auto on AVX2 CPUs; tally/native)
  int8-nat   Tally's native int8 per channel, activations int8 per block of 32 (--quantization int8)
  int4-nat   Tally's native int4, group 128 (64 where 128 does not divide K), int8 activations (--quantization int4)
  bf16       F.linear in bf16 (emulated without AVX-512 BF16)
  int8-dyn   FBGEMM dynamic int8 (per-tensor uint8 activations): for reference, not used by Tally — its
             activation scale is per batch, so a request's output would depend on its neighbours

    python benchmarks/weight_formats.py [--model smol|qwen] [--threads 1]
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import tally  # noqa: F401  first: it sets OpenMP's waiting policy before torch loads libgomp
import torch
import torch.nn.functional as F

SHAPES = {  # (N out, K in) per layer: qkv, o, gate_up, down; then the LM head
    "smol": ([(960, 576), (576, 576), (3072, 576), (576, 1536)], 30, (49152, 576)),
    "qwen": ([(1152, 896), (896, 896), (9728, 896), (896, 4864)], 24, (151936, 896)),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(SHAPES), default="smol")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", default="1,8,32")
    p.add_argument("--skip-bf16", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore", message=".*quantize_per_channel.*|.*deprecated.*")
    per_layer, layers, head = SHAPES[a.model]
    shapes = per_layer * layers + [head]
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen) * 0.05 for n, k in shapes]
    formats = {"fp32": [w for w in weights],
               "fp16w": [torch.ops.quantized.linear_prepack_fp16(w, None) for w in weights]}
    if not a.skip_bf16:
        formats["bf16"] = [w.bfloat16() for w in weights]
    int8 = []
    for w in weights:
        scale = (w.abs().amax(1) / 127).double()
        q = torch.quantize_per_channel(w, scale, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
        int8.append(torch.ops.quantized.linear_prepack(q, None))
    formats["int8-dyn"] = int8
    from tally.native import ops
    from tally.quant.native_linear import NativeInt4Linear, NativeInt8Linear
    from tally.quant.rtn import quantize_int4_groupwise, quantize_int8_per_channel

    if ops.available():
        formats["f16-nat"] = [(ops.pack_f16(w), w.shape[0]) for w in weights]
        formats["int8-nat"] = []
        for w in weights:
            q, scale = quantize_int8_per_channel(w)
            formats["int8-nat"].append(NativeInt8Linear(q, scale[:, None], None))
        int4 = []
        for w in weights:
            group = 128 if w.shape[1] % 128 == 0 else 64
            q, scale, zero = quantize_int4_groupwise(w, group)
            int4.append(NativeInt4Linear.from_q(q, scale, zero, group, None))
        formats["int4-nat"] = int4

    def step(name: str, m: int) -> float:
        xs = {k: torch.randn(m, k, generator=gen) for k in {k for _, k in shapes}}
        xb = {k: x.bfloat16() for k, x in xs.items()}
        t0 = time.perf_counter()
        for (_, k), w in zip(shapes, formats[name]):
            if name == "fp32":
                F.linear(xs[k], w)
            elif name == "bf16":
                F.linear(xb[k], w)
            elif name == "fp16w":
                torch.ops.quantized.linear_dynamic_fp16(xs[k], w)
            elif name == "f16-nat":
                ops.gemm_f16(xs[k], *w, None)
            elif name in ("int8-nat", "int4-nat"):
                w(xs[k])
            else:
                torch.ops.quantized.linear_dynamic(xs[k], w, True)
        return time.perf_counter() - t0

    rows = [int(r) for r in a.rows.split(",")]
    print(f"{a.model}: {len(shapes)} projections, {sum(n * k for n, k in shapes) / 1e6:.0f} M weights, "
          f"{a.threads} thread(s); best of 3, ms per pass")
    print("| rows | " + " | ".join(formats) + " | fp32 / fp16w |")
    print("|---|" + "---|" * (len(formats) + 1))
    for m in rows:
        times = {name: min(step(name, m) for _ in range(3)) * 1e3 for name in formats}
        print(f"| {m} | " + " | ".join(f"{t:.1f}" for t in times.values()) + f" | {times['fp32'] / times['fp16w']:.2f}× |")
    print("command: python " + " ".join(sys.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
