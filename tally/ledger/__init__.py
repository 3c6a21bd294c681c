"""The memory ledger: bytes of weights and KV cache, what fits on a device, and how fast it can go.

Pure arithmetic (no torch): `tally plan` prints it and the engine sizes its KV pool with
`tally.ledger.kv.KVLayout`, so the plan and the allocation share one source of truth.

Unit convention, used in every figure and printed under every table:
- GB = 10^9 bytes, GiB = 2^30 bytes; bandwidth (TB/s) and FLOP/s are decimal.
- Weights are exact byte counts, quoted in GB the way model sizes are (7B params in fp16 = 14 GB).
- Device memory is binary, as HBM is built and sold: an "80 GB" card holds 80 GiB. The reserve,
  the KV pool and KV per request are quoted in GiB.
The textbook example reproduces under this convention: 80 GiB - 14 GB weights - 12 GiB reserve =
54.96 GiB of KV pool; 4,096 tokens x 512 KiB = 2 GiB per request, so 27 requests fit (the textbook's
54 GB / 2 GB = 27), and with 8 KV heads (128 KiB per token, 512 MiB per request) 109, 4x as many.
"""
