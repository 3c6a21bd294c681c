"""Speculative decoding: proposals from prompt lookup or a draft model, the policy that decides whether and how many
to verify, and what it measured."""
