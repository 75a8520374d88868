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
    # rows are due at steps 2 and 4 (log_every) and 5 (the last); only those are built
    assert [logger.row_due(t) for t in range(1, 6)] == [False, True, False, True, True]
    for row in rows:
        step = row["step"]
        ranks = {"a": 2, "b": 1} if step == 3 else None
        logger.step(step, StepLog(0.1, budget=3, ranks=ranks),
                    row if logger.row_due(step) else None)
    assert files.calls == [("log", rows[1]), ("log_ranks", 3, {"a": 2, "b": 1}),
                           ("log", rows[3]), ("log", rows[4])]
    assert trackers.calls == [("log_row", rows[1]), ("log_ranks", 3, {"a": 2, "b": 1}),
                              ("log_row", rows[3]), ("log_row", rows[4])]
    # the bar moves on every step, with the row when there is one
    assert progress.calls == [("advance", 1, None), ("advance", 2, rows[1]),
                              ("advance", 3, None), ("advance", 4, rows[3]),
                              ("advance", 5, rows[4])]


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
