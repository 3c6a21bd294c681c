"""Next tokens from logits: penalties, filters, greedy and seeded sampling, logprobs."""
