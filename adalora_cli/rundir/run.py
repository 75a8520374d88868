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
import shlex
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..config import ConfigError, RunConfig, dump_config
from ..errors import RunBusy, WriteFailed, write_failed, writing
from .layout import (
    CONFIG,
    HEARTBEAT,
    HEATMAP,
    LAUNCH,
    LOCK,
    METRICS,
    RANK_HISTORY,
    RANK_PATTERN,
    RUN_NAMES,
    STATUS,
    STREAMS,
    SUMMARY,
    WEIGHTS,
)
from .summary import Summary

NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""A full disk, a full quota, or the file size limit (``ulimit -f``)."""


def follow_umask(path: Path) -> None:
    """Give ``path`` the mode a plain ``open`` would (0666 less the umask): some writers
    (safetensors, ``mkdtemp``) create private files, which a collaborator on a shared
    filesystem could not read."""
    mask = os.umask(0o022)
    os.umask(mask)  # read back: the only portable way to learn the umask
    if path.is_dir():
        os.chmod(path, 0o777 & ~mask)
        for child in path.iterdir():
            follow_umask(child)
    else:
        os.chmod(path, 0o666 & ~mask)


def fsync_path(path: Path) -> None:
    """Flush a folder's entries (or a file's data) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """``path`` replaced by ``text`` whole or not at all; a failure names ``path``."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.errno not in NO_ROOM or not path.exists():
            raise write_failed(path, err) from None
        # A full disk has no room for the copy, but a short status still fits over the
        # blocks of the old one: rewrite it in place rather than leave a stale status.
        with writing(path), open(path, "r+") as f:
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
        self._rows: dict[str, int] = {}  # rows in each stream (what a checkpoint records)

    @classmethod
    def create(cls, path: str | Path, cfg: RunConfig, processes: int = 1) -> RunDir:
        """Claim a new, empty directory for a run and write its config. ``processes``: how
        many run it, recorded so that every resume hint names them (:func:`resume_hint`)."""
        from .owner import identity

        path = Path(path)
        _check_makeable(path)
        path.mkdir(parents=True, exist_ok=True)
        if not (path / LOCK).exists():
            # no run was ever claimed here: a folder holding anything is refused as it was
            # found, before the lock file a claim creates is left behind in it
            _refuse_occupied(path)
        with locked(path):
            _refuse_occupied(path)
            run = cls(path)
            # status first: a directory with a status and no config reads as holding no run
            run._write_status({"status": "running", "started": _now(),
                               "processes": processes, **identity()})
            try:
                write_text_atomic(path / CONFIG, dump_config(cfg))
            except OSError as err:  # e.g. a full disk: say so in the status, then stop
                failed = err if isinstance(err, WriteFailed) else write_failed(path / CONFIG,
                                                                                err)
                run.fail(failed.strerror)
                raise failed from None
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
        _refuse_links(path)

    @classmethod
    def reopen(cls, path: str | Path, processes: int = 1) -> RunDir:
        """Claim an unfinished run (preempted, failed, or running with a dead owner) for
        ``processes`` processes."""
        from .owner import identity

        path = Path(path)
        with locked(path):  # checked again: another process may have claimed it meanwhile
            cls.check_claimable(path)
            run = cls(path)
            previous = run.read_status(path) or {}
            attempt = int(previous.get("attempt", 1)) + 1
            run._write_status({"status": "running", "started": previous.get("started", _now()),
                               "resumed": _now(), "attempt": attempt,
                               "processes": processes, **identity()})
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
        # The failure may be the disk itself: closing must not fail again before the
        # status says what happened, and the status must fit without new space.
        self.close(quiet=True)
        try:
            self.set_status("failed", error=error, ended=_now())
        except OSError:
            self._write_status_small({"status": "failed", "error": error[:200]})
        self._ended()

    def _write_status_small(self, data: dict[str, Any]) -> None:
        """The last resort on a full disk: overwrite status.json in place, within the
        blocks it already has, so it never says ``running`` for a run that is over."""
        text = json.dumps(data) + "\n"
        try:
            with open(self.path / STATUS, "r+") as f:
                info = os.fstat(f.fileno())
                room = max(info.st_size, info.st_blocks * 512)
                f.write(text if len(text) <= room else '{"status": "failed"}\n')
                f.truncate()
        except OSError:
            pass

    def preempt(self, reason: str, step: int) -> None:
        self.close(quiet=True)
        self.set_status("preempted", reason=reason, step=step, ended=_now())
        self._ended()

    def prune(self, reason: str, step: int) -> None:
        """A tune trial its study stopped at ``step``: ended, never finished (no summary),
        and not resumed by a sweep or a tune."""
        self.close(quiet=True)
        self.set_status("pruned", reason=reason, step=step, ended=_now())
        self._ended()

    def record_resume(self, changes: dict[str, list[Any]], lost: str | None = None,
                      machine: dict[str, list[Any]] | None = None) -> None:
        """Note in status.json what this attempt resumed with that the checkpoint did not:
        allowed config changes ({key: [before, now]}), rows a torn log lost, and another
        number of processes or autocast precision ({"processes": [2, 1]})."""
        status = self.read_status(self.path) or {}
        entry: dict[str, Any] = {"attempt": status.get("attempt", 1), "time": _now()}
        if changes:
            entry["config_changes"] = changes
        entry.update(machine or {})
        if lost:
            entry["log_rows_lost"] = lost
        if len(entry) > 2:
            self.set_status(status.get("status", "running"),
                            resumes=[*status.get("resumes", []), entry])

    # ---------------------------------------------------------------- streams
    def log(self, row: dict[str, Any]) -> None:
        line = json.dumps(json_safe(row), allow_nan=False) + "\n"
        # a full disk: the error names the file
        with writing(self.path / METRICS, then="resume the run"):
            if self._metrics is None:
                self._metrics = open(self.path / METRICS, "a", buffering=1)
            self._metrics.write(line)
        self._rows[METRICS] = self._rows.get(METRICS, 0) + 1

    def log_ranks(self, step: int, ranks: dict[str, int]) -> None:
        with writing(self.path / RANK_HISTORY, then="resume the run"):
            if self._ranks is None:
                self._ranks = open(self.path / RANK_HISTORY, "a", buffering=1)
            self._ranks.write(json.dumps({"step": step, "ranks": ranks}) + "\n")
        self._rows[RANK_HISTORY] = self._rows.get(RANK_HISTORY, 0) + 1

    def stream_sizes(self) -> dict[str, Any]:
        """Bytes and rows written to each stream so far, synced to disk with the checkpoint
        that records them ({name: bytes, ..., "rows": {name: rows}})."""
        for name, stream in ((METRICS, self._metrics), (RANK_HISTORY, self._ranks)):
            if stream is not None:
                with writing(self.path / name, then="resume the run"):
                    stream.flush()
                    os.fsync(stream.fileno())  # a host crash must not leave the log shorter
        sizes: dict[str, Any] = {
            name: (self.path / name).stat().st_size if (self.path / name).exists() else 0
            for name in STREAMS}
        sizes["rows"] = {name: self._rows.get(name, 0) for name in STREAMS}
        return sizes

    def truncate_streams(self, sizes: dict[str, Any]) -> str | None:
        """Cut each stream back to its size at a checkpoint: rows written after it by a
        killed attempt are written again, identically, by the resumed one.

        A stream shorter than the checkpoint says (a host crash before an older version
        synced the logs) is cut back to its last whole row, never padded; the rows lost
        before the checkpoint are returned in one line (None when nothing was lost)."""
        self.close()
        lost = []
        for name in STREAMS:
            path = self.path / name
            want = int(sizes.get(name, 0))
            if not path.exists():
                if want:
                    lost.append(f"{name} is missing ({sizes.get('rows', {}).get(name, '?')} "
                                "rows)")
                self._rows[name] = 0
                continue
            with open(path, "r+b") as f:
                have = os.fstat(f.fileno()).st_size
                if have >= want:
                    f.truncate(want)
                    f.seek(0)
                    self._rows[name] = f.read(want).count(b"\n")
                    continue
                data = f.read()
                keep = data.rfind(b"\n") + 1  # drop a torn last row
                f.truncate(keep)
                self._rows[name] = data[:keep].count(b"\n")
            rows = sizes.get("rows", {}).get(name)
            missing = (f"{rows - self._rows[name]} rows" if rows is not None
                       else f"{want - keep} bytes")
            lost.append(f"{name} lost {missing} before the checkpoint")
        return "; ".join(lost) or None

    def clear_outputs(self) -> None:
        """Forget everything an earlier attempt wrote (a resume with no checkpoint)."""
        self.close()
        self._rows = {}
        for name in (*STREAMS, RANK_PATTERN, HEATMAP, WEIGHTS, SUMMARY):
            (self.path / name).unlink(missing_ok=True)

    def close(self, quiet: bool = False) -> None:
        """Close the streams; ``quiet``: on the failure path, where the flush may fail
        again for the reason the run is failing (a full disk)."""
        streams = ((METRICS, self._metrics), (RANK_HISTORY, self._ranks))
        self._metrics = self._ranks = None
        for name, stream in streams:
            if stream is None:
                continue
            try:
                with writing(self.path / name, then="resume the run"):
                    stream.close()
            except OSError:
                if not quiet:
                    raise

    # ---------------------------------------------------------------- results
    def write_json(self, name: str, data: Any) -> Path:
        path = self.path / name
        write_json_atomic(path, data)
        return path

    def finish(self, summary: Summary) -> None:
        self.close()
        self.write_json(SUMMARY, summary.to_dict())
        self.set_status("finished", ended=_now())
        self._ended()

    def _ended(self) -> None:
        """The heartbeat says a live run's step; once status.json says how the run ended,
        it would only be stale (a resume writes a new one)."""
        try:
            (self.path / HEARTBEAT).unlink(missing_ok=True)
        except OSError:
            pass


def is_pruned(path: str | Path) -> bool:
    """A tune trial stopped by its study: over, though not finished."""
    return (RunDir.read_status(Path(path)) or {}).get("status") == "pruned"


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


def _check_makeable(path: Path) -> None:
    """Refuse, in one line, a ``--run-dir`` that cannot become a folder: a file, or a
    symbolic link to nothing (itself or a folder above it), where mkdir would say only
    "File exists"."""
    for p in (*reversed(path.parents), path):
        if p.is_symlink() and not p.exists():
            where = "" if p == path else f" lies under {p}, which"
            raise ConfigError(f"run directory {path}{where} is a symbolic link to "
                              f"{os.readlink(p)}, which does not exist; create that folder "
                              "first, or choose another --run-dir")
        if p.exists() and not p.is_dir():
            if p == path:
                raise ConfigError(f"run directory {path} is a file; choose another --run-dir")
            raise ConfigError(f"run directory {path} lies under {p}, which is a file; choose "
                              "another --run-dir")


def _refuse_links(path: Path) -> None:
    """A resumed run cuts its logs back and appends to them, and rewrites its other files:
    through a symbolic link that would change a file outside the run (metrics.jsonl linked
    to another run's log), so a run holding one is refused before anything is opened."""
    for name in RUN_NAMES:
        if (path / name).is_symlink():
            raise ConfigError(f"run {path} cannot be resumed: its {name} is a symbolic link "
                              f"to {os.readlink(path / name)}, and resuming would write "
                              "through it; replace the link with a copy of what it points "
                              "to, then resume")


def _refuse_occupied(path: Path) -> None:
    """A folder holding anything but a claim's own files is no place for a new run."""
    from .owner import owner_alive

    if any(p.name not in (LOCK, LAUNCH) for p in path.iterdir()):
        alive, why = owner_alive(path)
        if alive:
            raise RunBusy(f"run directory {path} is being run by {why}")
        raise ConfigError(_occupied(path))


def _occupied(path: Path) -> str:
    """Why a new run cannot go into ``path``, with the one way forward that works there:
    ``--resume`` only for a run that can be resumed (a finished run refuses it)."""
    new = f"run directory {path} already exists"
    if is_finished(path):
        return (f"{new} and holds a finished run; choose another --run-dir (runs are never "
                "overwritten)")
    if (path / CONFIG).is_file() and (path / STATUS).is_file():
        return (f"{new} and holds an unfinished run; continue it with {resume_hint(path)}, "
                "or choose another --run-dir (runs are never overwritten)")
    return (f"{new} and is not empty; choose another --run-dir (runs are never "
            "overwritten)")


def resume_command(path: str | Path, processes: int = 1, overrides: Iterable[str] = ()
                   ) -> str:
    """The command that continues the unfinished run in ``path``, as every hint prints it
    (a stopped run's error line, status.json, the report, a refusal).

    A run of several processes is resumed on as many (``--nproc N``): a sharded checkpoint
    (``train.sharding=fsdp``) resumes only on several processes, and a DDP one resumes
    exactly only on the number that wrote it. ``overrides``: key=value settings the command
    must carry (say ``train.sharding=fsdp``, where the run's config no longer says it)."""
    words = ["adalora", "train", "--resume", str(path), *overrides]
    if processes > 1:
        words += ["--nproc", str(processes)]
    return " ".join(shlex.quote(word) for word in words)  # copied into a shell as printed


def resume_hint(path: str | Path, status: dict[str, Any] | None = None) -> str:
    """:func:`resume_command` for a run directory, on the processes its ``status.json``
    (or ``status``, already read) records: 1 for a run that recorded none."""
    status = RunDir.read_status(Path(path)) if status is None else status
    processes = (status or {}).get("processes")
    return resume_command(path, processes if isinstance(processes, int) else 1)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
