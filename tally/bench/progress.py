"""The live progress line while a run goes on (rich, on stderr so stdout stays the report)."""
from __future__ import annotations

import asyncio

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.text import Text

from tally.bench.runner import RunState
from tally.units import format_s

_REFRESH_S = 0.25


def progress_line(state: RunState) -> Text:
    now_s = state.now_s()
    recent = [r.ttft_s for r in state.records[-200:] if r.ok and r.end_s is not None]
    late = [r.lateness_s for r in state.records[-200:] if r.sent_s is not None]
    total = f"/{state.expected}" if state.expected is not None else ""
    end = f"/{state.end_s:.0f}s" if state.end_s is not None else "s"
    line = (f"{now_s:6.1f}{end}  sent {len(state.records)}{total}  done {state.done}  "
            f"in flight {state.in_flight}  failed {state.failed}  "
            f"TTFT p50 (last 200) {format_s(float(np.median(recent)) if recent else None)}  "
            f"late max {format_s(max(late) if late else None)}")
    if state.stop_reason is not None:
        line += f"  cancelled {state.cancelled}  STOPPING: {state.stop_detail}"
    return Text(line, style="red" if state.failed else "")


async def show_progress(state: RunState, console: Console | None = None) -> None:
    """Redraws the line until cancelled."""
    console = console or Console(stderr=True)
    with Live(progress_line(state), console=console, refresh_per_second=1 / _REFRESH_S,
              transient=False) as live:
        try:
            while True:
                await asyncio.sleep(_REFRESH_S)
                live.update(progress_line(state))
        finally:
            live.update(progress_line(state))
