"""Request bookkeeping without torch: requests, the block pool, KV block tables with prefix caching, the scheduler."""
