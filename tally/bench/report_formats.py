"""A run's result in other tools' shapes, so comparison notebooks written for them read Tally's runs:
vLLM's `benchmark_serving.py --save-result` JSON, GuideLLM's report (tally/bench/report_guidellm.py), and one CSV
row per request."""
from __future__ import annotations

import csv
import io
import json
import statistics

import numpy as np

from tally.bench.report_guidellm import as_guidellm

FORMATS = ("tally", "vllm", "guidellm", "csv")
CSV_FIELDS = ("id", "phase", "warmup", "scheduled_s", "sent_s", "first_token_s", "last_token_s", "end_s", "ttft_s",
              "tpot_s", "e2e_s", "prompt_tokens", "output_tokens", "error")


def as_vllm(result: dict) -> dict:
    """vLLM's benchmark result: totals, throughputs, per-request lists, and mean / median / std / P99 of TTFT, TPOT,
    ITL and E2E latency in milliseconds (vLLM's key names)."""
    requests = [r for r in result["requests"] if not r["warmup"]]
    ok = [r for r in requests if r["error"] is None]
    summary = result["summary"]
    window = summary["window_s"]
    arrivals = result["workload"]["arrivals"]
    out = {
        "date": result["started_at"], "backend": "openai", "model_id": result["server"]["model"],
        "tokenizer_id": result["server"]["tokenizer"], "num_prompts": len(requests),
        # vLLM writes inf for "all at once"; a closed loop has no rate: null (JSON has no infinity).
        "request_rate": arrivals.get("rate_per_s"), "burstiness": arrivals.get("burstiness", 1.0),
        "max_concurrency": arrivals.get("max_concurrency", arrivals.get("concurrency")),
        "duration": window, "completed": len(ok),
        "total_input_tokens": sum(r["prompt_tokens"] for r in ok),
        "total_output_tokens": sum(r["output_tokens"] for r in ok),
        "request_throughput": summary["throughput"]["requests_per_s"],
        "request_goodput": (summary.get("goodput") or {}).get("requests_per_s"),
        "output_throughput": summary["throughput"]["output_tokens_per_s"],
        "total_token_throughput": summary["throughput"]["output_tokens_per_s"]
        + summary["throughput"]["prompt_tokens_per_s"],
        "input_lens": [r["prompt_tokens"] for r in requests], "output_lens": [r["output_tokens"] for r in requests],
        "ttfts": [_ttft(r) for r in requests], "itls": [r["itl_s"] for r in requests],
        "generated_texts": ["" for _ in requests],  # Tally does not keep texts
        "errors": ["" if r["error"] is None else f"{r['error']}: {r.get('detail') or ''}" for r in requests],
    }
    for key, values in (("ttft", [_ttft(r) for r in ok]), ("tpot", [_tpot(r) for r in ok if _tpot(r) is not None]),
                        ("itl", [x for r in ok for x in r["itl_s"]]), ("e2el", [_e2e(r) for r in ok])):
        ms = [v * 1e3 for v in values] or [0.0]
        out[f"mean_{key}_ms"] = statistics.fmean(ms)
        out[f"median_{key}_ms"] = statistics.median(ms)
        out[f"std_{key}_ms"] = float(np.std(ms))
        out[f"p99_{key}_ms"] = float(np.percentile(ms, 99))
    return out


def render(result: dict, fmt: str) -> str:
    """The text `--out` holds in another tool's format (`tally` is report_json.write_result's)."""
    if fmt == "csv":
        return as_csv(result)
    return json.dumps(as_vllm(result) if fmt == "vllm" else as_guidellm(result), allow_nan=False)


def as_csv(result: dict) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in result["requests"]:
        writer.writerow({**r, "ttft_s": _ttft(r), "tpot_s": _tpot(r), "e2e_s": _e2e(r)})
    return buf.getvalue()


def _ttft(r: dict) -> float | None:
    return None if r["first_token_s"] is None else r["first_token_s"] - r["sent_s"]


def _e2e(r: dict) -> float | None:
    return None if r["last_token_s"] is None else r["last_token_s"] - r["sent_s"]


def _tpot(r: dict) -> float | None:
    if r["first_token_s"] is None or r["last_token_s"] is None or r["output_tokens"] < 2:
        return None
    return (r["last_token_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)
