"""`tally serve`'s listening sockets, bound before the model loads: a port already in use fails at once, with what to
do, instead of after the load; uvicorn then serves on these sockets."""
from __future__ import annotations

import errno
import socket

from tally.errors import ConfigError


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """One socket per address `host` resolves to (as asyncio's create_server binds), not yet listening."""
    try:
        addresses = {(family, address) for family, _, _, _, address in
                     socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)}
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host}: not an address or a name this machine resolves ({exc.strerror})",
                          param="host") from None
    sockets: list[socket.socket] = []
    try:
        for family, address in sorted(addresses, key=str):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses the port
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise ConfigError(_bind_error(host, port, exc), param="port") from None
    return sockets


def _bind_error(host: str, port: int, exc: OSError) -> str:
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} is already in use on {host} (another server listens there; `ss -ltnp 'sport = "
                f":{port}'` shows which); stop it, or start with --port set to a free port")
    if exc.errno == errno.EACCES:
        return f"no permission to listen on {where} (ports below 1024 need root); use --port 1024 or above"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {where}: {host} is not an address of this machine; check --host"
    return f"cannot listen on {where}: {exc.strerror or exc}"
