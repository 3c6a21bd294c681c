"""Model definitions and checkpoint loaders. `config` is pure Python (the ledger reads it)."""
