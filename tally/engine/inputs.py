"""SchedulerOutput → the flat tensors of one forward pass (token ids, positions, slot mapping,
block tables), built with a loop over requests, never over tokens.

Rows are laid out one-token rows (every position past the prompt: decodes, a verify's tokens, a recomputed request's
generated tokens; a short draft span's tokens) first, one query each: the attention backends batch the leading
`num_decode_tokens` rows into one decode call (tally/attention/metadata.py). A prompt's one-token chunk is not a
decode: every prompt row runs through the prefill attention, so a prompt keeps its bits wherever a chunk or a
prefix-cache hit ends, and so does an output, whose positions always run as decodes."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tally.attention.metadata import AttentionMetadata
from tally.core.kv_manager import KVCacheManager
from tally.core.scheduler import SchedulerOutput


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    row_start: list[int]  # per entry of SchedulerOutput.scheduled: the flat index of its first token
    sample_rows: list[int]  # index into scheduled of the requests that sample a token this step
    sample_counts: list[int]  # per sample row: tokens sampled (1, or 1 + its speculative proposals)
    sample_token_index: torch.Tensor  # [sum(sample_counts)] flat index of each sampled position


def build_step_inputs(out: SchedulerOutput, kv: KVCacheManager) -> StepInputs:
    bs = kv.block_size
    ids: list[int] = []
    rows = _Rows()
    sample_rows, sample_counts, sample_index = [], [], []
    row_start = [0] * len(out.scheduled)
    # Positions past the prompt go in as decode rows (_Rows.add): a decode's token, a verify's last token and its
    # proposals, and the generated tokens of a request preempted by recompute, which the scheduler runs a step after
    # its prompt (tally/core/scheduler.py:tokens_to_compute), so they get the bits of the decode steps that made them
    decodes = [s.request.num_computed_tokens >= s.request.num_prompt_tokens for s in out.scheduled]
    decodes_first = sorted(range(len(out.scheduled)), key=lambda row: not decodes[row])
    for row in decodes_first:
        s = out.scheduled[row]
        req, n = s.request, s.num_new_tokens
        c = req.num_computed_tokens
        known = req.token_ids[c:c + n]
        ids.extend(known)
        if len(known) < n:  # speculative proposals after the known tokens
            ids.extend(req.spec_token_ids[:n - len(known)])
        row_start[row] = rows.qsl[-1]
        rows.add(kv.block_table(req.request_id), c, n, decodes[row])
        if c + n == req.num_tokens_with_spec:
            # A speculating request samples at its last known token and after each proposal, to verify them.
            count = 1 + len(req.spec_token_ids)
            sample_rows.append(row)
            sample_counts.append(count)
            sample_index.extend(range(rows.qsl[-1] - count, rows.qsl[-1]))
    input_ids, positions, meta = rows.flat_batch(ids, bs)
    return StepInputs(input_ids, positions, meta, row_start, sample_rows, sample_counts,
                      torch.tensor(sample_index, dtype=torch.int64))


def build_span_inputs(spans: list[tuple[list[int], int, list[int]]], block_size: int,
                      decodes_from: list[int]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
    """A forward pass over (block table, first position, token ids) spans, for a second model that keeps its KV in
    the same blocks (a draft model): token ids, positions, metadata, and the flat row of each span's last token, in
    the order given. Span i's positions from decodes_from[i] on (a request's outputs) go in as decode rows, the ones
    before it (its prompt) as one prefill sequence, as build_step_inputs lays a request's out: a position gets the
    kernel, and so the bits, the target model gave it. Every row's K/V is written before any row attends, so a
    span's decode rows see its prompt rows of the same pass."""
    ids: list[int] = []
    rows, last_rows = _Rows(), [0] * len(spans)
    cuts = [min(max(first - start, 0), len(tokens)) for (_, start, tokens), first in zip(spans, decodes_from)]
    for i, ((table, start, tokens), cut) in enumerate(zip(spans, cuts)):  # decode rows first
        if cut < len(tokens):
            ids.extend(tokens[cut:])
            rows.add(table, start + cut, len(tokens) - cut, as_decodes=True)
            last_rows[i] = rows.qsl[-1] - 1
    for i, ((table, start, tokens), cut) in enumerate(zip(spans, cuts)):
        if cut:
            ids.extend(tokens[:cut])
            rows.add(table, start, cut)
            if cut == len(tokens):
                last_rows[i] = rows.qsl[-1] - 1
    input_ids, positions, meta = rows.flat_batch(ids, block_size)
    return input_ids, positions, meta, torch.tensor(last_rows, dtype=torch.int64)


@dataclass
class _Rows:
    """Sequences laid out one after another, decodes first (the caller adds them in that order)."""

    starts: list[int] = field(default_factory=list)
    lens: list[int] = field(default_factory=list)
    tables: list[list[int]] = field(default_factory=list)
    qsl: list[int] = field(default_factory=lambda: [0])
    num_decode: int = 0

    def add(self, table: list[int], start: int, n: int, as_decodes: bool = False) -> None:
        """n tokens from position `start`; with `as_decodes`, as n single-token queries, each attending to the
        positions up to its own: the batched decode path (the native one-call step included) runs them. Exact:
        every row's K/V is written before any row attends, so each sees the tokens before it."""
        if as_decodes:
            self.starts.extend(range(start, start + n))
            self.lens.extend([1] * n)
            self.tables.extend([table] * n)
            self.qsl.extend(range(self.qsl[-1] + 1, self.qsl[-1] + n + 1))
            self.num_decode += n
        else:
            self.starts.append(start)
            self.lens.append(n)
            self.tables.append(table)
            self.qsl.append(self.qsl[-1] + n)

    def flat_batch(self, ids: list[int], bs: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        return _flat_batch(ids, self.starts, self.lens, self.tables, self.qsl, bs, self.num_decode)


def _flat_batch(ids: list[int], starts: list[int], lens: list[int], tables: list[list[int]], qsl: list[int],
                bs: int, num_decode: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Token ids, positions and attention metadata of sequences laid out one after another (decodes first)."""
    total = qsl[-1]
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int64)
    if num_decode == total:  # one token a sequence (a decode step): a row's slot is one lookup, no index tensors
        positions = torch.tensor(starts, dtype=torch.int64)
        slots = torch.tensor([t[s // bs] * bs + s % bs for t, s in zip(tables, starts)], dtype=torch.int64)
    else:
        lens_t = torch.tensor(lens)
        offsets = torch.arange(total) - torch.repeat_interleave(torch.tensor(qsl[:-1]), lens_t)
        positions = torch.repeat_interleave(torch.tensor(starts), lens_t) + offsets
        rows = torch.repeat_interleave(torch.arange(len(tables)), lens_t)
        slots = block_tables[rows, positions // bs] * bs + positions % bs
    meta = AttentionMetadata(
        query_start_loc=qsl, context_lens=[s + n for s, n in zip(starts, lens)], block_tables=block_tables,
        slot_mapping=slots, block_size=bs, num_decode_tokens=num_decode,
    )
    return torch.tensor(ids, dtype=torch.int64), positions, meta
