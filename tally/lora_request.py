"""`LoRARequest`: which LoRA adapter a request runs with, vLLM's class and field names, so
`llm.generate(prompts, params, lora_request=LoRARequest("sql", 1, "/adapters/sql"))` runs unchanged."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str  # the name requests pick it by (the server's `model` field)
    lora_int_id: int  # vLLM's handle of the adapter; positive
    lora_path: str = ""  # a PEFT folder (adapter_config.json + adapter_model.safetensors) or a GGUF LoRA (.gguf)
    base_model_name: str | None = None  # listed as the adapter's `parent` in /v1/models (default: the served model)

    def __post_init__(self) -> None:
        if not self.lora_name:
            raise ValueError("LoRARequest needs a lora_name")
        if self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be ≥ 1, got {self.lora_int_id}")
