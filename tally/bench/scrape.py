"""Reading a server's `/metrics` (tally/prometheus_text.py) and a local process's resident memory, for queue times,
soak series and the report's server view."""
from __future__ import annotations

from pathlib import Path

import httpx

from tally.prometheus_text import Exposition, parse


async def scrape(http: httpx.AsyncClient, base_url: str) -> Exposition | None:
    """The server's metrics now, or None when it has no usable /metrics."""
    try:
        response = await http.get(f"{base_url}/metrics")
        if response.status_code != 200:
            return None
        return parse(response.text)
    except (httpx.HTTPError, ValueError):
        return None


def process_rss_bytes(pid: int) -> int | None:
    """VmRSS of a local process (Linux /proc), or None if it is gone or unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
