"""Request queue, admission, token-budget scheduling and preemption."""
