"""The draft model's KV pool: blocks of its own, apart from the target's. The draft writes KV only for the requests
it drafts for, and only over their last tokens (from a fresh start's offset, tally/engine/speculation/draft_proposer.py),
so its pool is sized for those windows, not for every token the target holds: a draft never halves the target's pool.
What the sizing counts on is here; which request holds which blocks is the proposer's."""
from __future__ import annotations

from tally.engine.speculation.config import DRAFT_SHARE, MAX_SPECULATIVE_TOKENS

# A request's draft window grows with its output up to REBASE x draft_context_tokens (and a block) past its fresh
# start; then the draft starts afresh from its last tokens: a catch-up over draft_context_tokens, once per that many
# tokens the window grew.
REBASE = 2


def window_tokens(context_tokens: int, block_size: int, max_model_len: int) -> int:
    """The most positions one request's draft table covers: its window grown to the rebase point, and the proposals
    of one step past it; the whole context where the draft reads all of it (context_tokens 0)."""
    if not context_tokens:
        return max_model_len
    return min(rebase_tokens(context_tokens, block_size) + MAX_SPECULATIVE_TOKENS, max_model_len)


def rebase_tokens(context_tokens: int, block_size: int) -> int:
    """How far past its offset a request's tokens may reach before the draft starts afresh on it (a fresh start
    reads up to context_tokens + block_size - 1 of them: its offset is a block boundary)."""
    return REBASE * context_tokens + block_size


def draft_slots(max_num_seqs: int, adaptive: bool) -> int:
    """Requests drafted for at once: every running one with "adaptive": false; else one in DRAFT_SHARE, or all of
    fewer than DRAFT_SHARE (tally/engine/speculation/speculator.py)."""
    if not adaptive:
        return max_num_seqs
    return max(min(max_num_seqs, DRAFT_SHARE - 1), max_num_seqs // DRAFT_SHARE)


def budget_share(target_bytes_per_block: int, draft_bytes_per_block: int, adaptive: bool) -> float:
    """The most of the KV budget the draft's pool takes: it drafts for one running request in DRAFT_SHARE (every one
    with "adaptive": false), over no more of its tokens than the target holds, so its KV is at most that share of the
    target's, in its own bytes per block."""
    draft = draft_bytes_per_block / (DRAFT_SHARE if adaptive else 1)
    return draft / (target_bytes_per_block + draft)


class DraftBlocks:
    """The free list of the draft's pool (no sharing, no prefix cache: a draft never reads KV another request's
    draft wrote)."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # a stack, low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int]:
        """n blocks; the caller checked num_free."""
        taken = self._free[len(self._free) - n:][::-1]
        del self._free[len(self._free) - n:]
        return taken

    def give(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))
