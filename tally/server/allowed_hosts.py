"""`--allowed-hosts`: the Host header values the server answers, against DNS rebinding (a page whose name an attacker
re-points at 127.0.0.1 sends its own name as Host). An entry is a name or address (any port), `*.example.com` (its
subdomains), or either with a port (`localhost:8000`: that port only); IPv6 as `::1` or `[::1]`, `[::1]:8000` with a
port. Starlette's TrustedHostMiddleware compares without the port, so it could never match a host:port entry."""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

_NAME = r"[^\s:/\[\]@*]+"
_HOST = re.compile(rf"(?:\[(?P<ipv6>[0-9a-f:.]+)\]|(?P<name>{_NAME}|\*\.{_NAME}))(?::(?P<port>[0-9]{{1,5}}))?")


@dataclass(frozen=True)
class HostPattern:
    host: str  # lowercase; IPv6 without brackets; "*.example.com" for its subdomains
    port: str | None  # None: any port

    def matches(self, host: str, port: str | None) -> bool:
        if self.port is not None and port != self.port:
            return False
        return host == self.host or (self.host.startswith("*.") and host.endswith(self.host[1:]))


def parse_host(text: str, pattern: bool = False) -> HostPattern | None:
    """A Host header value (or, with `pattern`, an --allowed-hosts entry) as host and port; None when it cannot
    be one."""
    text = text.strip().lower()
    if _is_ipv6(text):  # ::1 without brackets: no port
        return HostPattern(text, None)
    m = _HOST.fullmatch(text)
    if m is None or (not pattern and (m["name"] or "").startswith("*")):
        return None
    return HostPattern(m["ipv6"] or m["name"], m["port"])


def _is_ipv6(text: str) -> bool:
    if text.count(":") < 2 or len(text) > 45:
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


class AllowedHosts:
    def __init__(self, entries: tuple[str, ...]) -> None:
        self.entries = entries
        self.any = "*" in entries
        self.patterns = {e: parse_host(e, pattern=True) for e in entries if e != "*"}

    def allows(self, host_header: str | None) -> bool:
        if self.any:
            return True
        host = None if host_header is None else parse_host(host_header)
        return host is not None and any(p is not None and p.matches(host.host, host.port)
                                        for p in self.patterns.values())

    def start_warnings(self, port: int) -> list[str]:
        """What to tell the operator at start about entries no client reaching this port directly can match."""
        warnings = []
        for entry, p in self.patterns.items():
            if p is None:
                warnings.append(f"--allowed-hosts entry {entry!r} can never match a Host header: write a name or "
                                "address, optionally with :PORT (localhost:8000, [::1]:8000, *.example.com)")
            elif p.port is not None and p.port != str(port):
                warnings.append(f"--allowed-hosts entry {entry!r} names port {p.port}, but the server listens on "
                                f"{port}: only clients that reach it through a proxy on port {p.port} send that Host")
        return warnings


class AllowedHostsMiddleware:
    """400 "Invalid host header" (Starlette's answer) to a request whose Host is not allowed."""

    def __init__(self, app: ASGIApp, allowed: AllowedHosts) -> None:
        self.app, self.allowed = app, allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and not self.allowed.allows(Headers(scope=scope).get("host")):
            await PlainTextResponse("Invalid host header", status_code=400)(scope, receive, send)
            return
        await self.app(scope, receive, send)
