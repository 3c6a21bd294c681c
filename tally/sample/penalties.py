"""Logit edits that depend on what a request has already seen: repetition / frequency / presence
penalties (vLLM's formulas) and the min_tokens mask on stop tokens. Applied in place.

Penalties are sparse: they gather the logits of the ids a row has seen, apply the formula, and
scatter back through a flat view, so the cost is O(tokens seen), never a [B, V] count table.
Rows are padded by repeating a real id of the same row; a duplicate index then writes the same
value as the real one (or adds 0), which keeps the scatter exact and deterministic."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tally.sampling_params import SamplingParams


@dataclass
class PenaltyTensors:
    rows: torch.Tensor  # [P] batch rows with any penalty
    row_list: list[int]  # the same on the host, to pick their outputs without a device sync
    repetition: torch.Tensor  # [P, 1]; 1 = off
    frequency: torch.Tensor  # [P, 1]; 0 = off
    presence: torch.Tensor  # [P, 1]; 0 = off
    prompt_ids: torch.Tensor | None  # [P, Lp] padded; None when no row has a repetition penalty
    prompt_fill: list[int]  # per row: an id to pad output ids with while a row has no output yet
    prompt_nonempty: torch.Tensor  # [P, 1] bool
    use_frequency_presence: bool

    @classmethod
    def build(
        cls, params: list[SamplingParams], prompt_token_ids: list[list[int]], device: torch.device
    ) -> PenaltyTensors | None:
        rows = [i for i, p in enumerate(params) if p.has_penalties]
        if not rows:
            return None
        chosen = [params[i] for i in rows]
        prompts = [prompt_token_ids[i] for i in rows]
        # An empty prompt pads with id 0; apply_penalties swaps in an output id or neutralises it.
        fill = [p[0] if p else 0 for p in prompts]

        def column(name: str) -> torch.Tensor:
            return torch.tensor([[getattr(p, name)] for p in chosen], dtype=torch.float32, device=device)

        use_repetition = any(p.repetition_penalty != 1.0 for p in chosen)
        return cls(
            rows=torch.tensor(rows, dtype=torch.long, device=device),
            row_list=rows,
            repetition=column("repetition_penalty"),
            frequency=column("frequency_penalty"),
            presence=column("presence_penalty"),
            prompt_ids=pad_rows(prompts, fill, device)[0] if use_repetition else None,
            prompt_fill=fill,
            prompt_nonempty=torch.tensor([[bool(p)] for p in prompts], device=device),
            use_frequency_presence=any(p.frequency_penalty or p.presence_penalty for p in chosen),
        )


def apply_penalties(logits: torch.Tensor, t: PenaltyTensors, output_token_ids: list[list[int]]) -> None:
    """vLLM order: repetition over prompt + output, then frequency and presence over output counts."""
    vocab = logits.shape[1]
    flat = logits.view(-1)
    outputs = [output_token_ids[r] for r in t.row_list]
    fill = [o[0] if o else f for o, f in zip(outputs, t.prompt_fill)]
    out_ids, out_lens = pad_rows(outputs, fill, logits.device)
    base = t.rows[:, None] * vocab
    if t.prompt_ids is not None:
        has_ids = t.prompt_nonempty | (out_lens[:, None] > 0)
        repetition = torch.where(has_ids, t.repetition, 1.0)
        prompt_ids = torch.where(t.prompt_nonempty, t.prompt_ids, out_ids[:, :1])
        idx = base + torch.cat([prompt_ids, out_ids], dim=1)
        seen = flat[idx]
        flat[idx] = torch.where(seen > 0, seen / repetition, seen * repetition)
    if t.use_frequency_presence:
        idx = base + out_ids
        valid = torch.arange(out_ids.shape[1], device=logits.device) < out_lens[:, None]
        # Each occurrence subtracts the penalty once, so duplicates sum to frequency * count.
        flat.index_put_((idx.view(-1),), (-t.frequency * valid).view(-1), accumulate=True)
        seen = flat[idx]
        flat[idx] = seen - t.presence * (out_lens[:, None] > 0)


@dataclass
class MinTokensTensors:
    rows: list[int]  # batch rows with min_tokens > 0 and at least one stop token
    min_tokens: list[int]
    stop_ids: torch.Tensor  # [M, S] eos + stop_token_ids, padded by repeating the first

    @classmethod
    def build(
        cls, params: list[SamplingParams], eos_token_ids: list[tuple[int, ...]], device: torch.device
    ) -> MinTokensTensors | None:
        rows, mins, stops = [], [], []
        for i, (p, eos) in enumerate(zip(params, eos_token_ids)):
            ids = sorted(set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos)))
            if p.min_tokens > 0 and ids:
                rows.append(i)
                mins.append(p.min_tokens)
                stops.append(ids)
        if not rows:
            return None
        return cls(rows, mins, pad_rows(stops, [s[0] for s in stops], device)[0])

    def active(self, output_token_ids: list[list[int]]) -> list[int]:
        """Positions (into self.rows) of rows still short of min_tokens."""
        return [j for j, (r, m) in enumerate(zip(self.rows, self.min_tokens)) if len(output_token_ids[r]) < m]


def apply_min_tokens(logits: torch.Tensor, t: MinTokensTensors, active: list[int]) -> None:
    pos = torch.tensor(active, dtype=torch.long, device=logits.device)
    rows = torch.tensor(t.rows, dtype=torch.long, device=logits.device)[pos]
    logits[rows[:, None], t.stop_ids[pos]] = float("-inf")


def pad_rows(
    lists: list[list[int]], fill: list[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """([n, L] int64 with row i padded by fill[i], [n] lengths); L >= 1 so empty rows still index."""
    width = max(1, max(map(len, lists)))
    padded = [ids + [f] * (width - len(ids)) for ids, f in zip(lists, fill)]
    lengths = torch.tensor([len(ids) for ids in lists], dtype=torch.long, device=device)
    return torch.tensor(padded, dtype=torch.long, device=device), lengths
