"""The one logger interface the training loop calls; it fans out to the chosen trackers.

Names, the same in every tracker:

    train/loss, train/lr, train/budget, train/orth_reg   every training row, at its step
    eval/<split>/<metric>                                every evaluation
    rank/<module path>, rank/total                       AdaLoRA: every mask event
    rank_heatmap (image)                                 AdaLoRA: see below
    final/...                                            the summary: metrics, parameter
                                                         counts, train_seconds,
                                                         peak_memory_bytes, device, ...

The rank heatmap (paper Figure 3) is drawn at the first mask event, then at a mask
event only when ``log.heatmap_every_s`` seconds have passed since the last drawing (mask
events can come every step), and always once at the end from the final rank pattern.

A backend that raises, or does not answer within ``log.tracker_timeout_s`` (within
``bounded.STOP_GRACE_S`` once a stop signal is pending), is reported once through ``warn``
and dropped; the others and the run directory carry on. Every backend call runs on that
backend's own thread (``bounded.py``), so a hung tracker holds neither the training loop
nor a stop. Nothing here raises into the training loop after ``open``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import TRACKER_SINKS, ConfigError, RunConfig, flatten
from ..errors import describe
from ..rundir.layout import RANK_PATTERN, TRACKERS
from .base import Sink, run_info
from .bounded import Pending, Worker, wait


def _backend(name: str):
    """The module that writes to tracker ``name`` (its PACKAGES say what it needs)."""
    return importlib.import_module(f"{__package__}.{TRACKER_SINKS[name]}")


def check_trackers(cfg: RunConfig) -> None:
    """Before training: every tracker in ``log.to`` has its packages installed."""
    for name in cfg.log.to:
        missing = [p for p in _backend(name).PACKAGES if importlib.util.find_spec(p) is None]
        if missing:
            raise ConfigError(
                f"log.to includes {name} but the {missing[0]} package is not installed; "
                f"run `make install` (it installs every tracker), or `pip install -e "
                f"'.[{name}]'` in the adalora checkout (or drop {name} from log.to)")


def read_state(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / TRACKERS).read_text())
    except (OSError, ValueError):
        return {}


class Trackers:
    """Fan-out over the selected backends; with none selected every call is a no-op."""

    def __init__(self, sinks: list[Sink], warn: Callable[[str], None], cfg: RunConfig,
                 run_dir: Path, *, stopping: Callable[[], bool] = lambda: False):
        self.sinks = sinks
        self.warn = warn
        self.timeout = cfg.log.tracker_timeout_s
        self.stopping = stopping
        """True once a stop signal is pending: tracker calls then get a short grace."""
        self.workers: dict[Sink, Worker] = {}  # each sink's thread
        self.run_dir = run_dir
        self.heatmap_every_s = cfg.log.heatmap_every_s
        self.label = f"{cfg.task.name} {cfg.method.name}"
        self.last_ranks: tuple[int, dict[str, int]] | None = None
        self.last_heatmap: float | None = None
        self.finished = False

    @classmethod
    def open(cls, cfg: RunConfig, run_dir: Path, *, resumed: bool,
             warn: Callable[[str], None],
             stopping: Callable[[], bool] = lambda: False) -> Trackers:
        run_dir = Path(run_dir)
        state = read_state(run_dir) if resumed else {}
        sinks, workers = [], {}
        for name in cfg.log.to:
            info = run_info(cfg, run_dir, resumed, state.get(name))
            worker = Worker(name)
            call = worker.submit(_backend(name).open_sink, info)
            why = wait(call.done, cfg.log.tracker_timeout_s, stopping)
            if why is None and call.error is not None:
                why = describe(call.error)
            if why is not None:  # a tracker never stops a run from starting
                worker.stop()
                warn(f"{name} could not be opened ({why}); "
                     "logging to the run directory only for it")
                continue
            sinks.append(call.value)
            workers[call.value] = worker
            state[name] = call.value.state
        if sinks:
            try:
                (run_dir / TRACKERS).write_text(json.dumps(state, indent=2) + "\n")
            except OSError as err:
                warn(f"{TRACKERS} could not be written ({describe(err)}); "
                     "a resumed run will start new tracker runs")
        trackers = cls(sinks, warn, cfg, run_dir, stopping=stopping)
        trackers.workers = workers
        return trackers

    # ------------------------------------------------------------------ the loop's calls
    def log_row(self, row: dict[str, Any]) -> None:
        if not self.sinks:
            return
        self._each("log_metrics", int(row["step"]), train_metrics(row))

    def log_eval(self, step: int, split: str, metrics: dict[str, float]) -> None:
        if not self.sinks:
            return
        self._each("log_metrics", step, eval_metrics(split, metrics))

    def log_ranks(self, step: int, ranks: dict[str, int]) -> None:
        if not self.sinks:
            return
        self.last_ranks = (step, dict(ranks))
        self._each("log_metrics", step, rank_metrics(ranks))
        now = time.monotonic()
        if self.last_heatmap is None or now - self.last_heatmap >= self.heatmap_every_s:
            self.last_heatmap = now
            self._heatmap(step, ranks, "ranks")

    def log_summary(self, summary: dict[str, Any]) -> None:
        if not self.sinks:
            return
        step = int(summary.get("total_steps") or 0)
        flat = flatten(summary, sep="/")
        numbers = {f"final/{k}": float(v) for k, v in flat.items() if _is_number(v)}
        texts = {k: v for k, v in flat.items() if isinstance(v, str)}
        self._each("log_summary", step, numbers, texts)
        final = self._final_pattern()
        if final is not None:
            self._heatmap(step, final, "final ranks")
        self.finished = True

    def close(self) -> None:
        for sink in list(self.sinks):
            self._call(sink, "close", self.finished)
        for worker in self.workers.values():
            worker.stop()
        self.sinks, self.workers = [], {}

    # ------------------------------------------------------------------ internals
    def _final_pattern(self) -> dict[str, int] | None:
        """The final rank pattern: rank_pattern.json when written, else the last mask event."""
        try:
            return json.loads((self.run_dir / RANK_PATTERN).read_text())
        except (OSError, ValueError):
            return self.last_ranks[1] if self.last_ranks else None

    def _heatmap(self, step: int, ranks: dict[str, int], what: str) -> None:
        try:
            image = _render(ranks, f"{self.label}: {what} at step {step} "
                                   f"(total {sum(ranks.values())})")
        except Exception as err:  # drawing is ours, but still never worth a run
            self.warn(f"the rank heatmap could not be drawn ({describe(err)}); skipped it")
            return
        self._each("log_image", step, "rank_heatmap", image)

    def _each(self, method: str, *args: Any) -> None:
        for sink in list(self.sinks):
            self._call(sink, method, *args)

    def _call(self, sink: Sink, method: str, *args: Any) -> None:
        """``sink.method(*args)`` on the sink's thread, waited for a bounded time (a signal
        handler's exception, raised in this thread while it waits, passes through)."""
        call = self._bounded(sink, method, *args)
        if isinstance(call, Pending) and call.error is None:
            return
        why = call if isinstance(call, str) else describe(call.error)
        self.sinks.remove(sink)
        self.warn(f"{sink.name} tracking failed ({why}); dropped it, "
                  "the run goes on and its run directory is complete")
        if method != "close" and isinstance(call, Pending):  # failed, but it answers
            self._bounded(sink, "close", False)  # it already failed once; one warning
        self.workers.pop(sink).stop()

    def _bounded(self, sink: Sink, method: str, *args: Any) -> Pending | str:
        """The call, once made, or why it was not waited for."""
        if sink not in self.workers:  # a sink handed to the constructor
            self.workers[sink] = Worker(sink.name)
        call = self.workers[sink].submit(getattr(sink, method), *args)
        why = wait(call.done, self.timeout, self.stopping)
        return call if why is None else why


def train_metrics(row: dict[str, Any]) -> dict[str, float]:
    """A training row of metrics.jsonl under the trackers' names."""
    return {f"train/{k}": float(v) for k, v in row.items() if k != "step" and _is_number(v)}


def eval_metrics(split: str, metrics: dict[str, Any]) -> dict[str, float]:
    return {f"eval/{split}/{k}": float(v) for k, v in metrics.items() if _is_number(v)}


def rank_metrics(ranks: dict[str, int]) -> dict[str, float]:
    metrics = {f"rank/{path}": float(r) for path, r in ranks.items()}
    metrics["rank/total"] = float(sum(ranks.values()))
    return metrics


def _render(ranks: dict[str, int], title: str):
    import io

    from PIL import Image

    from ..heatmap import heatmap_png

    return Image.open(io.BytesIO(heatmap_png(ranks, title=title))).convert("RGB")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
