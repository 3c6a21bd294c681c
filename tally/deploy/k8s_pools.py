"""`tally deploy k8s --plan plan.json`: the two length pools a `tally plan --lengths ... --out` result calls for —
each its own pods at its own max_model_len — and the `tally route` flags that send each request to its pool."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from tally.errors import ConfigError

MAIN, LONG = "main", "long"  # the pools' parts: objects named NAME-main and NAME-long


@dataclass(frozen=True)
class LengthPools:
    threshold_tokens: int  # tally route --long-threshold: the main pool's max_model_len
    max_model_lens: dict[str, int]  # per pool
    slot_ratio: float  # the long pool's concurrency over the main pool's, as the plan sized them

    @classmethod
    def from_plan(cls, path: Path) -> LengthPools:
        try:
            pools = json.loads(path.read_text())["pools"]
            main, long = pools[MAIN], pools[LONG]
            return cls(int(pools["long_threshold_tokens"]), {MAIN: int(main["max_model_len"]),
                                                             LONG: int(long["max_model_len"])},
                       int(long["concurrency"]) / max(int(main["concurrency"]), 1))
        except OSError as exc:
            raise ConfigError(f"--plan {path}: cannot read it ({exc.strerror})") from None
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"--plan {path}: not a `tally plan --lengths ... --out FILE` result (no pools "
                              "section with main and long)") from None

    def replicas(self, pool: str, main_replicas: int) -> int:
        """Pods per pool: the main pool's as asked; the long pool's in the plan's proportion of slots, at least 1."""
        return main_replicas if pool == MAIN else max(1, math.ceil(main_replicas * self.slot_ratio))
