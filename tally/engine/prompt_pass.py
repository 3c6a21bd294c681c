"""A step's prompt rows run a few layers at a time, beside decode steps (the --max-itl planner's way to keep streams
flowing while a long prompt prefills): each engine step runs the streams' decode step whole, then the next layers of
the held pass, so a stream waits one decode step and a slice of the prompt instead of a whole chunk's pass. The
chunk can then be large (its fixed costs paid once, as without a latency target) while no step runs long.

A pass split into slices runs the same layer calls on the same rows as one call would (CausalLM.run_layers), so the
prompt's KV and first token keep their bits; its requests are held out of the scheduler until it ends (their
computed tokens advance then), and a held request that leaves the running set (finished, aborted, preempted) drops
the pass: its blocks are gone, and what it computed is computed again from the request's computed tokens."""
from __future__ import annotations

import time

import torch

from tally.core.request import Request, RequestStatus
from tally.core.scheduler import SchedulerOutput
from tally.engine.runner import ModelRunner, StepResult


class PromptPass:
    def __init__(self, runner: ModelRunner, out: SchedulerOutput, pooling: bool, layer_s: float | None) -> None:
        """`out`: the prompt entries of a step, whose forward this pass runs; `layer_s`: what a layer of it is
        expected to take until one has run (None: unknown, the first slice runs one layer)."""
        self.runner = runner
        self.out = out
        self.requests: list[Request] = [s.request for s in out.scheduled]
        self._computed = [r.num_computed_tokens for r in self.requests]  # a preempted request restarts from 0
        self.prepared = runner.prepare(out, pooling)
        self.num_layers = len(runner.model.layers)
        self.next_layer = 0
        self.seconds = 0.0  # the pass's own time so far, slices and the head
        self._layer_s: list[float] = []  # each slice's seconds a layer
        self._expected_layer_s = layer_s
        with torch.inference_mode():
            self._h = runner.model.embed(self.prepared.step.input_ids)
            self._ropes = runner.model.ropes(self.prepared.step.positions)

    @property
    def tokens(self) -> int:
        return len(self.prepared.step.input_ids)

    @property
    def done(self) -> bool:
        return self.next_layer == self.num_layers

    def intact(self) -> bool:
        """Every request still runs from where the pass began (none finished, aborted or preempted)."""
        return all(r.status is RequestStatus.RUNNING and r.num_computed_tokens == c
                   for r, c in zip(self.requests, self._computed))

    @property
    def slowest_layer_s(self) -> float:
        """The slowest slice's seconds a layer so far (0 before the first)."""
        return max(self._layer_s, default=0.0)

    def layers_within(self, seconds: float) -> int:
        """Layers the next slice may run to take about `seconds`, by the slowest layer so far, or before any by the
        expected one (at least one)."""
        layer_s = self.slowest_layer_s or self._expected_layer_s
        if not layer_s:
            return 1
        return max(1, min(self.num_layers - self.next_layer, int(seconds / layer_s)))

    def advance(self, layers: int) -> None:
        """Run the next `layers` layers."""
        start, stop = self.next_layer, min(self.num_layers, self.next_layer + layers)
        began = time.perf_counter()
        step = self.prepared.step
        with torch.inference_mode(), self.runner.adapters(self.prepared):
            self._h = self.runner.model.run_layers(self._h, self._ropes, self.runner.kv_caches, step.meta, start,
                                                   stop)
        took = time.perf_counter() - began
        self.seconds += took
        self._layer_s.append(took / (stop - start))
        self.next_layer = stop

    def result(self) -> StepResult:
        """After the last layer: the final norm, the logits of the rows that need them, and the samples."""
        began = time.perf_counter()
        model, step = self.runner.model, self.prepared.step
        with torch.inference_mode():
            hidden = model.final_norm(self._h)
            rows = step.logit_rows
            logits = model.compute_logits(hidden[rows]) if len(rows) else \
                hidden.new_empty((0, model.cfg.vocab_size), dtype=torch.float32)
            result = self.runner.finish(self.prepared, logits, hidden if self.prepared.pooled else None)
        self.seconds += time.perf_counter() - began
        return result
