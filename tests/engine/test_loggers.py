"""The run logger: one call per event reaches the run files, the trackers and the progress
bar, with the run directory's rules (mask events always, rows every log_every steps and at
the last step, the bar on every step)."""

from __future__ import annotations

from adalora_cli.engine.loggers import RunLogger
from adalora_cli.engine.step import StepLog


class Recorder:
    """Stands in for the run files, the trackers and the progress bar at once."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


def test_steps_fan_out_by_the_run_directory_rules():
    files, trackers, progress = Recorder(), Recorder(), Recorder()
    logger = RunLogger(files, trackers, progress, log_every=2, steps=5)
    rows = [{"step": t, "loss": 1.0 / t, "lr": 0.1} for t in range(1, 6)]
    for row in rows:
        ranks = {"a": 2, "b": 1} if row["step"] == 3 else None
        logger.step(row, StepLog(0.1, budget=3, ranks=ranks))
    assert files.calls == [("log", rows[1]), ("log_ranks", 3, {"a": 2, "b": 1}),
                           ("log", rows[3]), ("log", rows[4])]
    assert trackers.calls == [("log_row", rows[1]), ("log_ranks", 3, {"a": 2, "b": 1}),
                              ("log_row", rows[3]), ("log_row", rows[4])]
    assert progress.calls == [("advance", row) for row in rows]


def test_evaluations_reach_files_trackers_and_the_bar():
    files, trackers, progress = Recorder(), Recorder(), Recorder()
    logger = RunLogger(files, trackers, progress, log_every=1, steps=5)
    logger.evaluating("validation")
    logger.evaluated(5, "validation", {"accuracy": 0.75})
    logger.evaluations_done()
    assert files.calls == [("log", {"step": 5, "split": "validation", "accuracy": 0.75})]
    assert trackers.calls == [("log_eval", 5, "validation", {"accuracy": 0.75})]
    assert progress.calls == [("note", "evaluating validation"),
                              ("scores", 5, "validation", {"accuracy": 0.75}), ("note", "")]
