"""Whose run is this, and is it still alive? Process identity, liveness and the heartbeat.

``status.json`` of a running run names its owner: host, pid, the pid's start time (from
``/proc``) and the machine's boot id. On the same host that identifies the process even
after its pid is reused; from another host of a shared filesystem the pid means nothing,
so the owner also keeps ``heartbeat.json`` fresh from a background thread (the last
optimizer step and the time), and a run whose heartbeat has gone stale has died.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .layout import HEARTBEAT, LAUNCH, STATUS


def heartbeat_seconds() -> float:
    """How often a live run rewrites its heartbeat (``ADALORA_HEARTBEAT_SECONDS``, 30 s)."""
    return float(os.environ.get("ADALORA_HEARTBEAT_SECONDS", "30"))


def stale_after() -> float:
    """A heartbeat older than this means the owner died (10 beats: slow shared disks)."""
    return 10 * heartbeat_seconds()


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), None elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: fields restart after the last ')'
    return int(stat.rsplit(")", 1)[1].split()[19])


def identity(pid: int | None = None) -> dict[str, Any]:
    pid = os.getpid() if pid is None else pid
    return {"host": socket.gethostname(), "pid": pid, "pid_start": _start_ticks(pid),
            "boot_id": _boot_id()}


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # signal 0: existence check only
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_heartbeat(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(path) / HEARTBEAT).read_text())
    except (OSError, ValueError):
        return None


def owner_alive(path: Path) -> tuple[bool, str]:
    """(alive, why) for the process that ``status.json`` says runs ``path``."""
    try:
        status = json.loads((Path(path) / STATUS).read_text())
    except (OSError, ValueError):
        return False, "no readable status.json"
    if status.get("status") != "running":
        return False, f"status {status.get('status')!r}"
    # the newer of the heartbeat and the claim: a resumed run's old heartbeat is stale
    beat = max(float((read_heartbeat(path) or {}).get("time", 0.0)),
               _written(Path(path) / STATUS)["time"])
    return process_alive(status, heartbeat={"time": beat})


def _written(path: Path) -> dict[str, float]:
    """A file's modification time as a heartbeat: before the first beat, the claim is one."""
    try:
        return {"time": path.stat().st_mtime}
    except OSError:
        return {"time": 0.0}


def launch_alive(path: Path) -> bool:
    """Whether a live sweep is starting this run (``launch.json``, see the sweep runner)."""
    try:
        record = json.loads((Path(path) / LAUNCH).read_text())
    except (OSError, ValueError):
        return False
    return process_alive(record, heartbeat=_written(Path(path) / LAUNCH))[0]


def process_alive(record: dict[str, Any], heartbeat: dict[str, Any] | None = None
                  ) -> tuple[bool, str]:
    """(alive, why) for the process an :func:`identity` record names.

    On its own host the pid, its start time and the boot id decide; from another host only
    a fresh ``heartbeat`` can say it lives (without one it is taken as alive)."""
    pid = record.get("pid")
    host = record.get("host", socket.gethostname())  # runs from before hosts were recorded
    if host == socket.gethostname():
        if record.get("boot_id") and record.get("boot_id") != _boot_id():
            return False, "the machine rebooted since it started"
        if not _pid_alive(pid):
            return False, f"process {pid} is gone"
        start = record.get("pid_start")
        if start is not None and _start_ticks(pid) != start:
            return False, f"process {pid} is gone (its pid now belongs to another process)"
        return True, f"process {pid} on this host"
    if heartbeat is None:
        return True, f"process {pid} on {host}"
    age = time.time() - float(heartbeat.get("time", 0))
    if age > stale_after():
        return False, f"no heartbeat from {host} for {age:.0f} s"
    return True, f"process {pid} on {host} (heartbeat {age:.0f} s ago)"


class Heartbeat:
    """Rewrites ``heartbeat.json`` every few seconds from a daemon thread while a run lives.

    The thread only reads ``self.step``; the loop sets it. A failed write (a full disk) is
    skipped: the heartbeat is a hint, and the loop itself reports disk errors."""

    def __init__(self, run_path: Path, enabled: bool = True):
        self.path = Path(run_path) / HEARTBEAT
        self.enabled = enabled  # off on torchrun ranks other than 0: they own no directory
        self.step = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="adalora-heartbeat",
                                        daemon=True)

    def __enter__(self) -> Heartbeat:
        self.beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def beat(self) -> None:
        if not self.enabled:
            return
        row = {"time": time.time(), "step": self.step, "pid": os.getpid(),
               "host": socket.gethostname()}
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(row) + "\n")
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)  # a full disk: leave no half-written copy behind

    def _run(self) -> None:
        while not self._stop.wait(heartbeat_seconds()):
            self.beat()


PARENT_ENV = "ADALORA_PARENT_PID"
"""Set by ``adalora sweep`` for its training processes: the pid they must not outlive."""


def die_with_parent() -> None:
    """Ask Linux to send us SIGTERM when the sweep that started us dies (even by SIGKILL),
    so a killed sweep leaves no orphans: each run checkpoints and stops as preempted."""
    # popped: our own children (torchrun ranks under --nproc) have another parent
    expected = os.environ.pop(PARENT_ENV, None)
    if not expected or not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != int(expected):  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
