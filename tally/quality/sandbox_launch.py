"""Started by sandbox.py as `python -I sandbox_launch.py MODE DIR`: shuts the program's doors, then runs DIR/main.py.
Stdlib only, and imports nothing of Tally: it runs in the sandbox, before the program, as the same interpreter.

MODE `namespace` (under `unshare -rnmpf`: user, network, mount and PID namespaces of its own, this process their
PID 1): every mount but DIR is remounted read-only, then all capabilities are dropped and main.py is exec'd, so it
can neither remount nor reach a network (the namespace has only a loopback, down), and when it ends the kernel ends
whatever it started. MODE `sockets` (no namespaces on this system): socket creation
is refused in this interpreter, then main.py runs in it — a best effort that code calling into C can get around."""
from __future__ import annotations

import ctypes
import os
import runpy
import socket
import sys

MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
PR_CAPBSET_DROP = 24
LAST_CAP = 63  # beyond the kernel's last capability, prctl fails harmlessly


def _mount(libc: ctypes.CDLL, source: str | None, target: str, flags: int) -> int:
    ok = libc.mount(source.encode() if source else None, target.encode(), None, flags, None) == 0
    return 0 if ok else ctypes.get_errno()


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        # Field 5 is the mount point, with spaces and the like written as octal escapes (\040).
        return [line.split()[4].encode().decode("unicode_escape") for line in f]


def read_only_but(keep: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if _mount(libc, None, "/", MS_REC | MS_PRIVATE) or _mount(libc, keep, keep, MS_BIND | MS_REC):
        sys.exit(f"sandbox: cannot set up the mount namespace: {os.strerror(ctypes.get_errno())}")
    os.chdir(keep)  # the cwd still pointed into the mount below the new bind mount, which turns read-only
    for point in _mount_points():
        if point == keep or point.startswith(keep + "/"):
            continue
        # A mount's flags that the namespace may not clear (nosuid, nodev, ...) are kept by passing them again.
        try:
            flags = os.statvfs(point).f_flag
        except OSError:
            continue  # a mount this process cannot see into
        err = _mount(libc, None, point, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        if err and point in ("/", "/tmp", "/home", "/root", "/dev/shm", "/var/tmp"):
            sys.exit(f"sandbox: cannot make {point} read-only: {os.strerror(err)}")
    for cap in range(LAST_CAP + 1):  # an empty bounding set: exec below leaves the program no capability
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)


def _refuse(*args: object, **kwargs: object) -> None:
    raise PermissionError("network access is disabled in the tally eval sandbox")


def refuse_sockets() -> None:
    for name in ("socket", "socketpair", "create_connection", "create_server", "fromfd"):
        setattr(socket, name, _refuse)


def main() -> None:
    mode, workdir = sys.argv[1], os.path.realpath(sys.argv[2])
    program = os.path.join(workdir, "main.py")
    if mode == "namespace":
        read_only_but(workdir)
        os.execv(sys.executable, [sys.executable, "-I", program])
    refuse_sockets()
    sys.argv = [program]
    runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    main()
