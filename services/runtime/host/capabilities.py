"""Drop root for an unprivileged user while keeping one Linux capability: CAP_SYS_NICE.

The ClickHouse engine applies a profile's `os_thread_priority` (the analyst's nice 19) only when
its threads hold CAP_SYS_NICE, and ignores the setting silently otherwise. A plain setuid from
root clears every capability, so the local server keeps this one, as the official server's
systemd unit does (`AmbientCapabilities=... CAP_SYS_NICE`). Every other capability leaves the
bounding set first, so nothing can bring it back.

Capabilities are per thread: call `drop_privileges` before the process starts any thread.
"""

import ctypes
import os
from pathlib import Path

CAP_SYS_NICE = 23
_PR_SET_KEEPCAPS = 8
_PR_CAPBSET_DROP = 24
_CAPABILITY_VERSION_3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def effective(pid: int | str = "self") -> int:
    """The effective capability set of a process, as its bit mask (/proc/PID/status, CapEff)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise OSError(f"no CapEff in /proc/{pid}/status")


def _check(result: int) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def drop_privileges(uid: int, gid: int, keep: int = CAP_SYS_NICE) -> None:
    """Become uid/gid with no supplementary groups, holding only `keep` if this process held it
    (a container may not grant it: `effective()` tells)."""
    libc = ctypes.CDLL(None, use_errno=True)
    kept = bool(effective() >> keep & 1)
    if kept:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        for cap in range(last + 1):
            if cap != keep:
                _check(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0))
        _check(libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0))  # setuid keeps the permitted set
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if kept:
        data = (_Data * 2)()  # every set empty but `keep`: the rest of the permitted set goes
        data[keep // 32].effective = data[keep // 32].permitted = 1 << keep % 32
        _check(libc.capset(ctypes.byref(_Header(_CAPABILITY_VERSION_3, 0)), data))
        _check(libc.prctl(_PR_SET_KEEPCAPS, 0, 0, 0, 0))
