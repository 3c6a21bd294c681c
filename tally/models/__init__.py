"""Model definitions, checkpoint readers (HF, GGUF, `tally quantize`, GPTQ/AWQ), tokenizer and chat template,
and the model builder. `config` is pure Python (the ledger reads it)."""
