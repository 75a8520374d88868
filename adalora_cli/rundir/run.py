"""The run directory as an object: claim it (a new run or a resume), write its status and
streams, and finish or fail it. File names live in :mod:`.layout`, ownership in :mod:`.owner`.

A run is finished only when ``summary.json`` exists and ``status.json`` says so; a crash
or a bad input leaves ``status: failed`` with the error, never a finished-looking run.
Claiming a directory (a new run, or resuming one) happens under an exclusive lock on
``.lock``, so two processes never both own one run.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..config import ConfigError, RunConfig, dump_config
from .layout import (
    CONFIG,
    HEATMAP,
    LAUNCH,
    LOCK,
    METRICS,
    RANK_HISTORY,
    RANK_PATTERN,
    STATUS,
    STREAMS,
    SUMMARY,
    WEIGHTS,
)


class RunBusy(Exception):
    """Another live process owns the run directory."""


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.errno != errno.ENOSPC or not path.exists():
            raise
        # A full disk has no room for the copy, but a short status still fits over the
        # blocks of the old one: rewrite it in place rather than leave a stale status.
        with open(path, "r+") as f:
            f.write(text)
            f.truncate()


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n")


def json_safe(value: Any) -> Any:
    """NaN and infinities become null, so every file we write stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive ownership decisions on one run directory (flock on its ``.lock``)."""
    fd = os.open(path / LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def default_run_dir(cfg: RunConfig, root: str | Path = "runs") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{cfg.task.name}-{cfg.method.name}-s{cfg.train.seed}-{stamp}"
    path, n = base, 1
    while path.exists():  # two runs started in the same second: never share a directory
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


class RunDir:
    """Writes one run directory; never overwrites an existing run."""

    def __init__(self, path: Path):
        self.path = path
        self._metrics = None
        self._ranks = None

    @classmethod
    def create(cls, path: str | Path, cfg: RunConfig) -> RunDir:
        """Claim a new, empty directory for a run and write its config."""
        from .owner import identity, owner_alive

        path = Path(path)
        if path.exists() and not path.is_dir():
            raise ConfigError(f"run directory {path} is a file; choose another --run-dir")
        path.mkdir(parents=True, exist_ok=True)
        with locked(path):
            if any(p.name not in (LOCK, LAUNCH) for p in path.iterdir()):
                alive, why = owner_alive(path)
                if alive:
                    raise RunBusy(f"run directory {path} is being run by {why}")
                raise ConfigError(_occupied(path))
            run = cls(path)
            # status first: a directory with a status and no config reads as holding no run
            run._write_status({"status": "running", "started": _now(), **identity()})
            write_text_atomic(path / CONFIG, dump_config(cfg))
        return run

    @staticmethod
    def check_claimable(path: str | Path) -> None:
        """Refuse, before any work, to resume what is not a run, is finished, or is live."""
        from .owner import owner_alive

        path = Path(path)
        if not path.is_dir() or not (path / CONFIG).is_file() or not (path / STATUS).is_file():
            raise ConfigError(f"{path} is not a run directory (no {CONFIG} and {STATUS}); pass "
                              "a directory written by adalora train")
        if is_finished(path):
            raise ConfigError(f"run {path} is finished; nothing to resume (start a new run "
                              "with adalora train CONFIG)")
        alive, why = owner_alive(path)
        if alive:
            raise RunBusy(f"run {path} is being run by {why}")

    @classmethod
    def reopen(cls, path: str | Path) -> RunDir:
        """Claim an unfinished run (preempted, failed, or running with a dead owner)."""
        from .owner import identity

        path = Path(path)
        with locked(path):  # checked again: another process may have claimed it meanwhile
            cls.check_claimable(path)
            run = cls(path)
            previous = run.read_status(path) or {}
            attempt = int(previous.get("attempt", 1)) + 1
            run._write_status({"status": "running", "started": previous.get("started", _now()),
                               "resumed": _now(), "attempt": attempt, **identity()})
        return run

    # ---------------------------------------------------------------- status
    def _write_status(self, data: dict[str, Any]) -> None:
        write_json_atomic(self.path / STATUS, data)

    def set_status(self, status: str, **fields: Any) -> None:
        current = self.read_status(self.path) or {}
        current.update(fields)
        current["status"] = status
        if status != "failed":  # an error from an earlier attempt no longer applies
            current.pop("error", None)
        self._write_status(current)

    @staticmethod
    def read_status(path: Path) -> dict[str, Any] | None:
        try:
            return json.loads((Path(path) / STATUS).read_text())
        except (OSError, ValueError):
            return None

    def fail(self, error: str) -> None:
        self.close()
        self.set_status("failed", error=error, ended=_now())

    def preempt(self, reason: str, step: int) -> None:
        self.close()
        self.set_status("preempted", reason=reason, step=step, ended=_now())

    # ---------------------------------------------------------------- streams
    def log(self, row: dict[str, Any]) -> None:
        if self._metrics is None:
            self._metrics = open(self.path / METRICS, "a", buffering=1)
        self._metrics.write(json.dumps(json_safe(row), allow_nan=False) + "\n")

    def log_ranks(self, step: int, ranks: dict[str, int]) -> None:
        if self._ranks is None:
            self._ranks = open(self.path / RANK_HISTORY, "a", buffering=1)
        self._ranks.write(json.dumps({"step": step, "ranks": ranks}) + "\n")

    def stream_sizes(self) -> dict[str, int]:
        """Bytes written to each stream so far (flushed): what a checkpoint records."""
        for stream in (self._metrics, self._ranks):
            if stream is not None:
                stream.flush()
        return {name: (self.path / name).stat().st_size if (self.path / name).exists() else 0
                for name in STREAMS}

    def truncate_streams(self, sizes: dict[str, int]) -> None:
        """Cut each stream back to its size at a checkpoint: rows written after it by a
        killed attempt are written again, identically, by the resumed one."""
        self.close()
        for name in STREAMS:
            path = self.path / name
            if path.exists():
                with open(path, "r+b") as f:
                    f.truncate(sizes.get(name, 0))

    def clear_outputs(self) -> None:
        """Forget everything an earlier attempt wrote (a resume with no checkpoint)."""
        self.close()
        for name in (*STREAMS, RANK_PATTERN, HEATMAP, WEIGHTS, SUMMARY):
            (self.path / name).unlink(missing_ok=True)

    def close(self) -> None:
        for stream in (self._metrics, self._ranks):
            if stream is not None:
                stream.close()
        self._metrics = self._ranks = None

    # ---------------------------------------------------------------- results
    def write_json(self, name: str, data: Any) -> Path:
        path = self.path / name
        write_json_atomic(path, data)
        return path

    def finish(self, summary: dict[str, Any]) -> None:
        self.close()
        self.write_json(SUMMARY, summary)
        self.set_status("finished", ended=_now())


def is_finished(path: str | Path) -> bool:
    status = RunDir.read_status(Path(path)) or {}
    return status.get("status") == "finished" and (Path(path) / SUMMARY).is_file()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    rows = []
    with open(Path(path) / METRICS) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    return rows


def _occupied(path: Path) -> str:
    """Why a new run cannot go into ``path``, with the one way forward that works there:
    ``--resume`` only for a run that can be resumed (a finished run refuses it)."""
    new = f"run directory {path} already exists"
    if is_finished(path):
        return (f"{new} and holds a finished run; choose another --run-dir (runs are never "
                "overwritten)")
    if (path / CONFIG).is_file() and (path / STATUS).is_file():
        return (f"{new} and holds an unfinished run; continue it with adalora train --resume "
                f"{path}, or choose another --run-dir (runs are never overwritten)")
    return (f"{new} and is not empty; choose another --run-dir (runs are never "
            "overwritten)")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
