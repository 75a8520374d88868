"""Every tracker call is bounded: a tracker that does not answer within
``log.tracker_timeout_s`` is dropped with one warning and the run goes on, a stop signal
cuts the wait short, and a stop raised while waiting is the run's, not the tracker's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import mlflow.tracking  # noqa: F401  (imported before the bound is timed, as in a run)
import pytest

from adalora_cli.config import ConfigError, load_config
from adalora_cli.errors import Preempted
from adalora_cli.tracking import Trackers, bounded
from adalora_cli.tracking.base import Sink

from .hung_server import HungServer

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke" / "glue.yaml")
DROPPED = "dropped it, the run goes on and its run directory is complete"


def guarded(fn, limit: float = 60.0):
    """``fn()`` in a thread, with a hang guard (not a speed assertion: without the bounds
    these calls waited out MLflow's retries, over 15 minutes)."""
    box: dict = {}

    def run() -> None:
        try:
            box["out"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed back to the test
            box["out"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert not thread.is_alive(), "the tracker call was not bounded"
    return box["out"]


class Recording(Sink):
    """A tracker that answers at once and keeps what it was given."""

    name = "recording"

    def __init__(self):
        self.steps: list[int] = []
        self.closed: list[bool] = []

    def log_metrics(self, step, metrics):
        self.steps.append(step)

    def log_summary(self, step, numbers, texts):
        pass

    def close(self, finished):
        self.closed.append(finished)


class Hanging(Recording):
    """A tracker whose log call never returns until the test releases it."""

    name = "hanging"

    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def log_metrics(self, step, metrics):
        self.release.wait(120)


def trackers_of(*sinks: Sink, warnings: list[str], timeout: float = 600,
                stopping=lambda: False) -> Trackers:
    cfg = load_config(SMOKE, [f"log.tracker_timeout_s={timeout}"])
    return Trackers(list(sinks), warnings.append, cfg, Path("."), stopping=stopping)


def test_a_hung_mlflow_server_costs_one_warning_and_the_bound(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    warnings: list[str] = []
    with HungServer() as server:
        cfg = load_config(SMOKE, ["log.to=[tensorboard,mlflow]",
                                  f"log.mlflow_uri={server.uri}", "log.tracker_timeout_s=3"])
        trackers = guarded(lambda: Trackers.open(cfg, tmp_path, resumed=False,
                                                 warn=warnings.append))
        calls = server.api_calls()
    # its /health answered, so the run went on into MLflow's API, which never answered
    assert calls and calls[0].startswith("GET /api/2.0/mlflow/experiments/get-by-name")
    assert warnings == ["mlflow could not be opened (no answer within 3 s, "
                        "log.tracker_timeout_s); logging to the run directory only for it"]
    assert [s.name for s in trackers.sinks] == ["tensorboard"]  # the other tracker opened
    trackers.close()


def test_a_tracker_that_hangs_mid_run_is_dropped_and_the_others_go_on():
    warnings: list[str] = []
    good, hung = Recording(), Hanging()
    trackers = trackers_of(good, hung, warnings=warnings, timeout=0.5)
    guarded(lambda: trackers.log_row({"step": 1, "loss": 0.5}))
    assert warnings == [f"hanging tracking failed (no answer within 0.5 s, "
                        f"log.tracker_timeout_s); {DROPPED}"]
    trackers.log_row({"step": 2, "loss": 0.25})
    trackers.close()
    hung.release.set()
    assert good.steps == [1, 2] and good.closed == [False]
    assert hung.closed == []  # never called again: its thread is still in the hung call
    assert len(warnings) == 1


def test_a_pending_stop_cuts_the_wait_to_the_grace(monkeypatch):
    monkeypatch.setattr(bounded, "STOP_GRACE_S", 0.3)
    stop = threading.Event()
    warnings: list[str] = []
    hung = Hanging()
    trackers = trackers_of(hung, warnings=warnings, timeout=600, stopping=stop.is_set)
    threading.Timer(0.2, stop.set).start()  # a signal noted while the call hangs
    guarded(lambda: trackers.log_row({"step": 1, "loss": 0.5}))
    hung.release.set()
    assert warnings == [f"hanging tracking failed (no answer within 0.3 s of the stop "
                        f"signal); {DROPPED}"]
    assert trackers.sinks == []


def test_a_stop_raised_while_waiting_is_the_runs_not_the_trackers():
    """Inside an evaluation a stop signal raises at once (engine/signals.py); raised while
    the run waits for a tracker, it ends the wait and reaches the loop, and the tracker,
    which did nothing wrong, is kept."""
    def handler(signum, frame):
        raise Preempted("stopped by SIGALRM")

    warnings: list[str] = []
    hung = Hanging()
    trackers = trackers_of(hung, warnings=warnings, timeout=30)
    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        with pytest.raises(Preempted):
            trackers.log_eval(4, "validation", {"accuracy": 0.5})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        hung.release.set()
    assert warnings == [] and trackers.sinks == [hung]
    trackers.close()
    assert hung.closed == [False]


def test_the_bound_must_be_positive():
    with pytest.raises(ConfigError, match=r"log.tracker_timeout_s must be > 0, got 0.0"):
        load_config(SMOKE, ["log.tracker_timeout_s=0"])


WANDB_OPEN = """
import sys
import wandb  # imported before the bound is timed
from adalora_cli.config import load_config
from adalora_cli.tracking import Trackers
cfg = load_config(sys.argv[1], ["log.to=[wandb]", "log.wandb_mode=online",
                                "log.tracker_timeout_s=5"])
trackers = Trackers.open(cfg, sys.argv[2], resumed=False, warn=print)
print("opened:", [s.name for s in trackers.sinks])
trackers.close()
"""


@pytest.mark.e2e
def test_wandb_against_a_silent_server_is_bounded_and_the_process_exits(tmp_path):
    """A fresh interpreter, so W&B's service process starts and is torn down at exit as in
    a real run (W&B makes the process wait for that at exit)."""
    pytest.importorskip("wandb")
    with HungServer() as server:
        env = {**os.environ, "WANDB_BASE_URL": server.uri, "WANDB_API_KEY": "0" * 40,
               "WANDB_SILENT": "true", "WANDB_CONFIG_DIR": str(tmp_path / "config"),
               "WANDB_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
        env.pop("WANDB_MODE", None)
        # a hang guard, not a speed assertion: before the bound W&B waited 90 s in init
        done = subprocess.run([sys.executable, "-c", WANDB_OPEN, SMOKE, str(tmp_path)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=75)
        calls = server.api_calls()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[1] == "opened: []"
    assert lines[0].startswith("wandb could not be opened (")
    assert lines[0].endswith("); logging to the run directory only for it")
    assert calls and calls[0].startswith("POST /graphql")  # it did ask the server


MLFLOW_GOES_SILENT = """
import sys, threading
from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
from adalora_cli.config import load_config
from adalora_cli.tracking import Trackers, mlflow_sink
mlflow_sink.FLUSH_S = 0.0  # every row is sent as it comes
cfg = load_config(sys.argv[1], ["log.to=[mlflow]", f"log.mlflow_uri=sqlite:///{sys.argv[2]}/m.db"])
trackers = Trackers.open(cfg, sys.argv[2], resumed=False, warn=print)  # a new store: seconds
trackers.timeout = 2.0
# from here on the store never answers a metric, as a server gone silent mid-run
SqlAlchemyStore._log_metrics = lambda self, *args: threading.Event().wait()
trackers.log_row({"step": 1, "loss": 0.5})
trackers.close()
print("closed")
"""


@pytest.mark.e2e
def test_an_mlflow_send_that_hangs_does_not_hold_the_process_at_exit(tmp_path):
    """The interpreter waits at exit for the threads of MLflow's asynchronous queue, so a
    send that never returned held a finished run's process for as long as MLflow retried;
    the sink's own sender thread is left behind."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    # a hang guard, not a speed assertion: before, this process never exited
    done = subprocess.run([sys.executable, "-c", MLFLOW_GOES_SILENT, SMOKE, str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"mlflow tracking failed (no answer within 2 s, log.tracker_timeout_s); {DROPPED}",
        "closed"]
