"""The ledger's plan is what the engine allocates: KV tensor bytes equal the plan exactly, and the
process's measured memory growth (weights + KV) is within 15% of the planned total."""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys

import pytest

from tally.cli import main as tally_main
from tally.models.registry import resolve_model

pytestmark = pytest.mark.slow
KV_BUDGET = 256 * 2**20

_MEASURE = f"""
import json, torch, transformers, tally.engine.engine
def rss():
    with open('/proc/self/status') as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith('VmRSS'))
before = rss()
from tally import LLM
llm = LLM(None, dtype='float32', quantization='none', max_model_len=512, kv_cache_memory={KV_BUDGET})
after = rss()
m = llm.engine
kv_tensor_bytes = sum({{t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                       for pair in m.kv_caches for t in pair}}.values())
print(json.dumps(dict(growth=after - before, kv_tensor_bytes=kv_tensor_bytes, blocks=m.snapshot().num_blocks,
                      ledger=m.ledger.to_dict())))
"""


def test_engine_memory_matches_the_plan():
    gguf = str(resolve_model(None).path)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert tally_main(["plan", "--model", gguf, "--weights", "dense", "--dtype", "fp32", "--kv-cache-dtype", "fp32",
                           "--max-model-len", "512", "--memory", "8GiB", "--bandwidth", "50GB/s",
                           "--flops", "100G", "--json"]) == 0
    plan = json.loads(buf.getvalue())
    out = subprocess.run([sys.executable, "-c", _MEASURE], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    planned_blocks = KV_BUDGET // plan["kv"]["bytes_per_block_per_device"]
    assert got["blocks"] == planned_blocks
    assert got["kv_tensor_bytes"] == planned_blocks * plan["kv"]["bytes_per_block_per_device"]
    assert got["ledger"]["kv_pool_bytes"] == got["kv_tensor_bytes"]
    planned_weights = plan["weights"]["total_bytes"]
    assert abs(got["ledger"]["weight_bytes"] - planned_weights) / planned_weights < 0.01
    planned_total = planned_weights + got["kv_tensor_bytes"]
    assert abs(got["growth"] - planned_total) / planned_total < 0.15, (got["growth"], planned_total)
