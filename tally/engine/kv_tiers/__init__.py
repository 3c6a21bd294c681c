"""The KV tiers below the pool: the swap space preemption writes blocks to and the disk prefix tier, their
figures, and the identity a stored block is keyed by. What the scheduler asks of them is tally/core/kv_tiers.py."""
