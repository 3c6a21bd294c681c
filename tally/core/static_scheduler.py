"""Static batching, kept only to measure what continuous batching buys (`--scheduling static`, benchmarks).

A batch forms from the queue until it holds max_num_seqs requests or the queue is empty; it then runs to
completion (its prefills first, then decodes), and nobody joins it midway. The next batch forms once it is done.
"""
from __future__ import annotations

from tally.core.request import Request
from tally.core.scheduler import Scheduler


class StaticBatchScheduler(Scheduler):
    _forming = True

    def _begin_step(self) -> None:
        if not self.running:
            self._forming = True

    def _may_run(self, req: Request) -> bool:
        return not (self._forming and req.num_output_tokens > 0)  # decode only once the batch is complete

    def _may_admit(self) -> bool:
        return self._forming

    def _end_step(self) -> None:
        if len(self.running) >= self.config.max_num_seqs or not self.waiting:
            self._forming = False
