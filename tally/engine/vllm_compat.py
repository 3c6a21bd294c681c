"""vLLM options that mean nothing on a CPU engine. `LLM(...)` and `tally serve` accept them so vLLM code and
command lines run unchanged, and say in one warning that they were ignored (tally/server/vllm_flags.py,
tally/engine/llm.py)."""
from __future__ import annotations

# option name (LLM keyword / flag without dashes) -> takes a value (False: a switch)
NO_EFFECT = {
    "gpu_memory_utilization": True, "enforce_eager": False, "cpu_offload_gb": True,
    "trust_remote_code": False, "disable_log_requests": False, "disable_custom_all_reduce": False,
    "max_seq_len_to_capture": True, "device": True, "distributed_executor_backend": True,
    "worker_use_ray": False, "disable_frontend_multiprocessing": False, "uvicorn_log_level": True,
}
