"""Start-up in phases: place this process's threads, load the checkpoint and measure the projection path, build the
model, size and allocate the KV pool, and write the ledger of what it took."""
