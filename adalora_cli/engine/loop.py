"""The one training loop: build -> claim the run directory -> maybe resume -> steps ->
evaluate -> checkpoint -> finish.

A new run (:func:`train`) and a resumed one (:func:`resume`) share everything after the
claim. Within an optimizer step a stop signal is only noted (see ``signals.py``); at the
step boundary the loop evaluates and checkpoints when due, and then honours a stop by
checkpointing and leaving the run ``preempted``. Resuming restores the state saved by
``checkpoint.py`` and cuts the run's streams back to the checkpoint, so the resumed run
writes exactly the rows the uninterrupted one would have.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..config import ConfigError, RunConfig, dump_config
from ..errors import Preempted, Pruned, RunBusy, first_line, warning
from ..rundir.layout import CONFIG
from ..rundir.run import (
    RunDir,
    default_run_dir,
    read_metrics,
    resume_command,
    write_text_atomic,
)
from ..rundir.summary import Summary
from ..tasks import progress as task_progress
from ..tracking import Trackers, check_trackers
from . import checkpoint as ckpt
from . import faults, sharded_checkpoint, sharding
from . import selection as best
from . import trial as tune_trial
from .build import Built, build_run, run_device
from .calibration import calibrate
from .distributed import (
    World,
    any_rank,
    barrier,
    broadcast,
    check_masks,
    gather,
    global_mean,
    init,
    leave_together,
    masks_from_rank0,
    per_rank_batch,
    rank_died,
    shutdown,
    world,
)
from .fingerprint import KEY as DATA_KEY
from .fingerprint import check_data, data_record
from .header import built_line, loading, machine, say
from .loggers import RunLogger, open_trackers
from .order import EpochBatches, example_lengths
from .outputs import trained_state, write_outputs
from .precision import decide
from .progress import TrainProgress
from .progress import check_env as check_progress_env
from .signals import StopSignals
from .split import LengthSplit
from .step import StepLog, Stepper


def train(cfg: RunConfig, run_dir: str | Path | None = None, quiet: bool = False) -> Path:
    """Train, evaluate and write a new run directory. Returns its path."""
    w = world()
    with StopSignals() as stop:
        check_trackers(cfg)  # a missing tracker package fails before anything
        check_progress_env()
        per_rank_batch(cfg.train.batch_size, w)
        built = _build(cfg, w, quiet)  # every user error is raised here, before anything is written
        _say_notes(built, w)
        init(w, built.device.type)
        try:
            # built.cfg: b(T) written out when the config gave adalora.target_rank
            run = _on_rank0(w, lambda: RunDir.create(run_dir or default_run_dir(cfg),
                                                     built.cfg, processes=w.size))
            done = _own(built, run, stop, quiet, None, resumed=False, w=w)
            leave_together(w)
            return done
        finally:
            shutdown()


def resume(path: Path, cfg: RunConfig, quiet: bool = False,
           note=lambda text: None) -> Path:
    """Continue the unfinished run in ``path`` with ``cfg`` (checked by the caller).

    A run may resume on more or fewer processes than it started with, or on a device that
    runs another autocast precision: what carries over exactly and what cannot is said in
    one note and recorded in status.json (checkpoint.describe_machine_changes)."""
    w = world()
    with StopSignals() as stop:
        RunDir.check_claimable(path)  # a finished or live run is refused before the build
        found = ckpt.newest_readable(path, note)  # falls back past a damaged newest one
        changes = ckpt.check_config(*found, cfg) if found else {}  # refuses another run
        check_trackers(cfg)
        check_progress_env()
        per_rank_batch(cfg.train.batch_size, w)
        built = _build(cfg, w, quiet)
        _say_notes(built, w)
        if found and DATA_KEY in found[1]:  # rows appended or edited since: another run
            check_data(found[0], found[1][DATA_KEY],
                       data_record(built.data.train, built.data.eval_splits))
        elif found:
            note(f"{found[0].name} was written before checkpoints recorded their data; "
                 "resuming without checking that the data is the same")
        init(w, built.device.type)

        def reopen() -> RunDir:
            run = RunDir.reopen(path, processes=w.size)
            write_text_atomic(path / CONFIG, dump_config(cfg))
            run.latest = found[0] if found else None
            if run.latest is None:
                note(f"{path} has no checkpoint yet; starting it over from step 0")
                run.clear_outputs()
                return run
            machine = ckpt.machine_changes(found[1], w.size, built.precision.autocast)
            if changes:
                note("resuming with " + ", ".join(f"{k} {a!r} -> {b!r}"
                                                  for k, (a, b) in changes.items())
                     + " (recorded in status.json)")
            if machine:
                note(ckpt.describe_machine_changes(machine) + " (recorded in status.json)")
            if changes or machine:
                run.record_resume(changes, machine=machine)
            return run

        try:
            run = _on_rank0(w, reopen)
            latest = broadcast(run.latest, w)
            done = _own(built, run, stop, quiet, latest, resumed=True, w=w)
            leave_together(w)
            return done
        finally:
            shutdown()


def _build(cfg: RunConfig, w: World, quiet: bool) -> Built:
    """:func:`build_run`, said as it goes (rank 0, unless quiet): the device and precision
    before the model loads, the loading and its progress, then what was built (header.py).
    The precision is decided here, once, and the build keeps that decision."""
    quiet = quiet or not w.main
    device = run_device(cfg, w)  # (a device that is not there: refused here)
    precision = decide(cfg, device)  # (a base dtype it cannot run: refused here)
    if not quiet:
        say(machine(precision))
    with loading(cfg, precision, quiet):
        built = build_run(cfg, w, precision)
    if not quiet:
        say(built_line(built))
    return built


def _say_notes(built: Built, w: World) -> None:
    """What the task has to say about the data (e.g. rows left out), once, not per rank."""
    if w.main:
        for line in built.data.notes:
            warning(line)


class Silent:
    """What ranks other than 0 hold instead of the run directory: they write nothing."""

    latest = None

    def __init__(self, path: Path):
        self.path = Path(path)

    def log(self, row: dict[str, Any]) -> None: ...
    def log_ranks(self, step: int, ranks: dict[str, int]) -> None: ...
    def stream_sizes(self) -> dict[str, int]: return {}
    def truncate_streams(self, sizes: dict[str, int]) -> None: ...
    def record_resume(self, changes, lost=None, machine=None) -> None: ...
    def fail(self, error: str) -> None: ...
    def preempt(self, reason: str, step: int) -> None: ...
    def prune(self, reason: str, step: int) -> None: ...
    def finish(self, summary: Summary | None) -> None: ...


def _on_rank0(w: World, claim: Callable[[], RunDir]) -> RunDir | Silent:
    """Rank 0 claims the run directory; the others learn its path, or its refusal."""
    if not w.distributed:
        return claim()
    run, outcome = None, None
    if w.main:
        try:
            run = claim()
            outcome = ("ok", str(run.path))
        except (ConfigError, RunBusy) as err:
            outcome = (type(err).__name__, str(err))
    outcome = broadcast(outcome, w)
    if outcome[0] != "ok":
        raise (RunBusy if outcome[0] == "RunBusy" else ConfigError)(outcome[1])
    return run if w.main else Silent(Path(outcome[1]))


def _own(built: Built, run: RunDir | Silent, stop: StopSignals, quiet: bool,
         latest: Path | None, *, resumed: bool, w: World) -> Path:
    """Run the loop in a claimed directory and leave it finished, preempted or failed.

    Trackers mirror the run directory; a resumed run reattaches to its tracker runs. Stop
    signals are only noted from here on (see signals.py), so the directory is always left
    in a state that says what happened."""
    with stop.deferred():
        return _own_deferred(built, run, stop, quiet, latest, resumed=resumed, w=w)


def _own_deferred(built: Built, run: RunDir | Silent, stop: StopSignals, quiet: bool,
                  latest: Path | None, *, resumed: bool, w: World) -> Path:
    trackers = None
    try:
        trackers = open_trackers(built.cfg, run.path, resumed=resumed, main=w.main, stop=stop)
        summary = _loop(built, run, stop, quiet or not w.main, latest, trackers, w)
        trackers.log_summary(summary.to_dict() if summary else {})  # finished on close
    except BaseException as caught:
        err = rank_died(caught, w, run.path) or caught  # a rank died: said so, not a socket
        err = tune_trial.diverged(built.cfg, err)  # a tune trial's diverged loss: pruned
        if isinstance(err, Preempted):
            run.preempt(str(err), step=err.step)
        elif isinstance(err, Pruned):
            run.prune(str(err), step=err.step)
        else:
            reason = "interrupted by the user" if isinstance(err, KeyboardInterrupt) else (
                f"{type(err).__name__}: {first_line(err)}")
            run.fail(reason)
        try:
            err.run_dir = run.path  # lets the CLI name the directory it marked
        except AttributeError:
            pass
        if err is caught:
            raise
        raise err from None
    finally:
        if trackers is not None:
            trackers.close()
    run.finish(summary)
    if w.main:
        ckpt.remove_all(run.path)  # a finished run keeps its final weights, not checkpoints
        best.remove(run.path)  # ... which are the chosen step's under train.select=best
    return run.path


@dataclass
class LoopState:
    """The loop's state in one object: what :func:`setup` made (the model as it trains,
    the step, the data order, the best-step selection) and where the run stands (``pos``,
    what a checkpoint saves), with what every step boundary does to it."""

    built: Built
    run: RunDir | Silent
    stop: StopSignals
    w: World
    quiet: bool
    latest: Path | None
    """The checkpoint this attempt resumed from; None for a fresh start."""
    model: torch.nn.Module
    """The model the step trains: ``built.model``, wrapped under DDP."""
    stepper: Stepper
    generator: torch.Generator
    """The data order's generator, checkpointed with each epoch's start."""
    batches: EpochBatches
    loader: DataLoader
    selection: best.Selection | None
    """train.select=best's judge of the evaluations; None without it."""
    pos: ckpt.Position
    dataset: dict[str, Any]
    """The data's sizes and fingerprint, for every checkpoint (rank 0's; {} elsewhere)."""
    sharded: bool
    start: float = 0.0
    """When this attempt's training began (perf_counter): the run's time adds to it."""
    logger: RunLogger | None = None
    beat: Any = None
    """The run directory's heartbeat; its step is the run's last."""

    def stopped_early(self) -> bool:
        return self.selection is not None and self.selection.stopped_at is not None

    def stop_now(self):
        """Where a stop signal ends an evaluation at once. Under FSDP every forward is
        collective: a stop may not cut one process's evaluation short while the others
        wait in it, so there it is honoured after the evaluation."""
        return contextlib.nullcontext() if self.sharded else self.stop.immediate()

    def stopped(self, why: str | None) -> Preempted:
        return Preempted(f"stopped by {why or 'a signal to another process'} at step "
                         f"{self.pos.step}; resume with "
                         f"{resume_command(self.run.path, self.w.size)}", step=self.pos.step)

    def evaluate(self, step: int) -> dict[str, dict[str, float]]:
        return _evaluate(self.built, self.stepper, step, self.logger, self.w)

    def save(self, before_eval: tuple[list, dict] | None = None) -> None:
        """Checkpoint the run at ``pos.step`` (every rank's RNG states; rank 0 writes)."""
        pos, selection, run = self.pos, self.selection, self.run
        self.stepper.check_finite()  # never checkpoint weights a non-finite loss trained
        pos.seconds_now = pos.seconds + time.perf_counter() - self.start
        rngs = (before_eval[0] if before_eval  # every rank's
                else gather(ckpt.rng_state(), self.w))
        extra = {best.KEY: selection.record()} if selection is not None else {}
        path = _save(run, self.built, self.stepper, self.generator, pos, rngs, self.dataset,
                     self.w, before_eval, extra)
        if path is not None:  # rank 0 wrote it
            pos.checkpoint_bytes = _size(path)
            if selection is not None:  # the bests no kept checkpoint resumes to go
                best.after_checkpoint(run.path, pos.step, selection.step,
                                      [int(c.name[5:]) for c in ckpt.checkpoints(run.path)])
        pos.saved_step = pos.step

    def choose(self, step: int, results: dict[str, dict[str, float]]) -> bool:
        """Rank 0 judges the evaluation at ``step`` (train.select=best); every rank learns
        the selection, or its refusal. True when ``step`` is the new best."""
        outcome = None
        if self.w.main:
            try:
                self.selection.observe(step, results, self.built.task)
                outcome = ("ok", self.selection.record())
            except ConfigError as err:
                outcome = ("refused", str(err))
        outcome = broadcast(outcome, self.w)
        if outcome[0] != "ok":
            raise ConfigError(outcome[1])
        self.selection.restore(outcome[1])
        return self.selection.step == step

    def boundary(self, eval_due: bool, synced: bool) -> None:
        """After optimizer step ``pos.step``: evaluate, checkpoint, honour a stop.
        ``synced``: this step reads device values anyway (a logged row, a mask event); only
        then, or before an evaluation or a checkpoint, do the processes of a distributed
        run agree on a stop (an all-reduce the host waits for)."""
        pos, t_cfg, w, selection = self.pos, self.built.cfg.train, self.w, self.selection
        save_due = bool(t_cfg.save_every) and pos.step % t_cfg.save_every == 0
        if eval_due:
            self.stepper.check_finite()
            # all an evaluation changes; gathered now, while every rank is here
            before = (gather(ckpt.rng_state(), w), self.run.stream_sizes())
            try:
                with self.stop_now():
                    results = self.evaluate(pos.step)
            except Preempted:
                self.save(before_eval=before)  # the resumed run evaluates this step again
                raise self.stopped(self.stop.received) from None
            if w.main:  # a tune trial reports to its study, which may stop it here
                tune_trial.observe(self.built.cfg, pos.step, results)
            if selection is not None and pos.step > 0:  # step 0: the untrained model
                if self.choose(pos.step, results) and w.main:
                    best.publish(self.run.path, pos.step,
                                 trained_state(self.built.model, self.built.handle),
                                 _controller_state(self.built.handle))
                if selection.stop_due():
                    selection.stopped_at = pos.step
                    _say_early_stop(selection, self.quiet)
        if save_due:
            self.save()
        if w.distributed and not (synced or eval_due or save_due):
            return  # (one process checks its own flag for free, below)
        if any_rank(self.stop.received is not None, w):  # every rank stops at this step
            if pos.saved_step != pos.step:
                self.save()
            raise self.stopped(self.stop.received)

    def summary(self, results: dict[str, dict[str, float]],
                train_seconds: float) -> Summary | None:
        """Write the outputs (rank 0) once training and its last evaluation are done; a
        sharded model is gathered whole first, by every process."""
        built, pos, selection = self.built, self.pos, self.selection
        final = (sharding.gather_final(self.model, built.handle) if self.sharded
                 else None)  # whole, once
        if not self.w.main:
            return None
        # epochs actually run (fractional under max_steps): the report's time per epoch
        epochs = pos.step / math.ceil(len(self.loader) / built.cfg.train.grad_accum)
        chosen = selection.step if selection is not None else None
        summary = write_outputs(built, self.run, results, train_seconds, epochs,
                                pos.checkpoint_bytes, final,
                                chosen_step=chosen if chosen != pos.step else None)
        summary.precision = built.precision.record(self.stepper.skipped)
        if selection is not None:
            summary.selected = selection.summary(last_step=pos.step)
        if built.cfg.train.eval_at_start:
            summary.metrics_at_start = _metrics_at_start(self.run)
        return summary


def setup(built: Built, run: RunDir | Silent, stop: StopSignals, quiet: bool,
          latest: Path | None, w: World) -> LoopState:
    """Everything the loop needs before its first step: the model placed (sharded, or on
    the device and wrapped under DDP), the step, the same masks on every rank, the data
    order and its loader, the selection, and the state ``latest`` restores."""
    cfg, model, data, handle, steps = built.cfg, built.model, built.data, built.handle, built.steps
    t_cfg, device = cfg.train, built.device
    sharded = sharding.enabled(cfg)
    if sharded:  # in place, onto the device: eval and the outputs see the sharded model
        sharding.shard(model, handle, w, device, built.precision.amp_dtype)
    else:
        model.to(device)
    # a method's pass before training (EVA) sets its ranks here, on the device, before the
    # optimizer sees the parameters; a resumed run takes them from its checkpoint. Its time
    # is the run's: the method spent it to train
    passed = calibrate(built, w, quiet or not w.main,
                       ckpt.load_checkpoint(latest)[0] if latest is not None
                       and built.handle.calibration is not None else None)
    model.train()
    if w.distributed and not sharded:  # DDP: gradients all-reduced (averaged) in backward;
        # eval uses ``built.model``
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    stepper = Stepper.build(model, handle, t_cfg, steps, built.precision)
    masks_from_rank0(handle.allocator, w)  # the same masks on every rank, by construction
    generator = torch.Generator().manual_seed(t_cfg.seed)
    lengths = example_lengths(data.train) if t_cfg.group_by_length else None
    batches = EpochBatches(data.train, t_cfg.batch_size, generator, lengths, world=w)
    # pinned batches on CUDA, so the step's copies to the GPU need not wait for it
    loader = DataLoader(data.train, batch_sampler=batches, generator=generator,
                        collate_fn=LengthSplit(data.collate, t_cfg.length_split),
                        pin_memory=device.type == "cuda")
    selection = best.plan(cfg, built.task, list(data.eval_splits))  # train.select=best
    if w.main and latest is None:
        best.remove(run.path)  # an attempt that left no checkpoint starts over
    pos = (_restore(latest, built, stepper, run, w, selection) if latest is not None
           else ckpt.Position())
    dataset = data_record(data.train, data.eval_splits) if w.main else {}
    return LoopState(built, run, stop, w, quiet, latest, model, stepper, generator, batches,
                     loader, selection, pos, dataset, sharded,
                     start=time.perf_counter() - passed)


def _loop(built: Built, run: RunDir | Silent, stop: StopSignals, quiet: bool,
          latest: Path | None, trackers: Trackers, w: World) -> Summary | None:
    """The run's summary (None on ranks other than 0, which write nothing): set up, score
    what is due before the first step, train epoch by epoch to T (each step's boundary
    evaluates, checkpoints and honours a stop), checkpoint, evaluate last, write."""
    s = setup(built, run, stop, quiet, latest, w)
    pos, t_cfg, steps, stepper = s.pos, built.cfg.train, built.steps, s.stepper
    # (the header said the precision, train.precision=auto's choice on a CPU included)
    with TrainProgress(total=steps, disable=quiet, start=pos.step) as progress, \
            _heartbeat(run, w) as beat, task_progress.listening(progress.report):
        s.logger = RunLogger(run, trackers, progress, t_cfg.log_every, steps)
        s.beat = beat
        beat.step = pos.step
        if pos.eval_pending:  # a resumed run whose last evaluation was cut short
            s.boundary(eval_due=True, synced=True)
        elif t_cfg.eval_at_start and pos.step == 0 and latest is None and steps > 0:
            # (a run of no steps, method none, is scored once: its final evaluation)
            try:  # nothing to checkpoint yet: a stop here leaves a run to start over
                with stop.immediate():
                    s.evaluate(0)
            except Preempted:
                raise s.stopped(stop.received) from None
            progress.restart_clock()  # the eta is the training's, not the evaluation's
        while pos.step < steps and not s.stopped_early():
            if pos.epoch_start is None:  # a fresh epoch (not one being resumed)
                pos.epoch_start, pos.consumed = s.generator.get_state(), 0
            else:
                s.generator.set_state(pos.epoch_start)
            s.batches.skip = pos.consumed
            # The losses stay on the device (float64 sums, docs/training.md#host-syncs):
            # they are read only for a logged row, so other steps never wait for the GPU.
            micro, loss_sum = 0, None
            for pieces in s.loader:  # one piece unless train.length_split > 1
                loss, reg = stepper.backward_pieces(pieces, s.batches.weight, built.device)
                loss = global_mean(loss, s.batches.weight, w)  # the global batch's mean
                micro, pos.consumed = micro + 1, pos.consumed + 1
                loss_sum = loss if loss_sum is None else loss_sum + loss
                if micro % t_cfg.grad_accum and pos.consumed < len(s.loader):
                    continue
                pos.step += 1
                faults.hit("midstep", pos.step)
                mean = loss_sum / micro
                # a non-finite loss ends the run (at the next check below), or is skipped
                # under fp16 loss scaling
                log = stepper.update(pos.step, mean)
                row_due = s.logger.row_due(pos.step)
                if row_due or log.ranks is not None:
                    stepper.check_finite()
                row = (_train_row(pos.step, float(mean), log, reg, stepper.handle.reg_name)
                       if row_due else None)
                micro, loss_sum = 0, None
                if log.ranks is not None:  # every rank must have chosen the same ranks
                    check_masks(built.handle.allocator.mask, pos.step, w)
                s.logger.step(pos.step, log, row)
                beat.step = pos.step
                faults.hit("step", pos.step)
                s.boundary(eval_due=bool(t_cfg.eval_every) and pos.step % t_cfg.eval_every == 0
                           and pos.step < steps, synced=row_due or log.ranks is not None)
                if pos.step >= steps or s.stopped_early():
                    break
            else:  # the epoch ran out: the next one draws a new order
                pos.epoch, pos.epoch_start = pos.epoch + 1, None
        if pos.saved_step != pos.step:
            s.save()  # protects the final evaluation (long for SQuAD and summarization)
        train_seconds = pos.seconds + time.perf_counter() - s.start
        stepper.check_finite()  # (a run whose last steps needed no checkpoint)
        try:
            with s.stop_now():  # the checkpoint at T is saved: a stop loses nothing
                if not s.stopped_early():  # (early stopping just scored this step)
                    results = s.evaluate(pos.step)
                if s.selection is not None:
                    if not s.stopped_early():
                        s.choose(pos.step, results)
                    results = _take_chosen(built, stepper, s.selection, pos.step, run.path,
                                           s.logger, w)
        except Preempted:
            raise s.stopped(stop.received) from None
        if w.main:  # e.g. SQuAD's answers; a task without predictions writes nothing
            built.task.save_predictions(run.path)
    return s.summary(results, train_seconds)


def _controller_state(handle) -> dict[str, Any] | None:
    return handle.allocator.state_dict() if handle.allocator is not None else None


def _say_early_stop(selection: best.Selection, quiet: bool) -> None:
    if not quiet:
        print(f"early stopping at step {selection.stopped_at}: {selection.name} has not "
              f"improved on step {selection.step}'s {selection.value:.6g} in "
              f"{selection.since} evaluation{'s' if selection.since != 1 else ''} "
              f"(train.early_stop_patience={selection.patience})", file=sys.stderr, flush=True)


class _Unrecorded:
    """The logger of the chosen step's second scoring: its rows and scores are in
    metrics.jsonl and the trackers already, so only the progress note shows."""

    def __init__(self, logger: RunLogger):
        self.logger = logger

    def evaluating(self, split: str) -> None:
        self.logger.evaluating(split)

    def evaluated(self, step: int, split: str, metrics: dict[str, float]) -> None: ...

    def evaluations_done(self) -> None:
        self.logger.evaluations_done()


def _take_chosen(built: Built, stepper: Stepper, selection: best.Selection, last: int,
                 run_path: Path, logger: RunLogger, w: World
                 ) -> dict[str, dict[str, float]]:
    """End with the chosen step: its tensors and rank controller state put back (rank 0,
    which writes the outputs) and scored again, so that the summary's metrics and the
    predictions are that step's. The last step, chosen, is as it was scored."""
    step = selection.step if selection.step is not None else last
    faults.hit("chosen", step)
    if w.main and step != last:
        tensors, controller = best.load(run_path, step)
        built.model.load_state_dict(tensors, strict=False)
        if controller is not None:
            built.handle.allocator.load_state_dict(controller)
    return _evaluate(built, stepper, step, _Unrecorded(logger), w)


def _metrics_at_start(run: RunDir) -> dict[str, dict[str, float]] | None:
    """The step-0 evaluation (train.eval_at_start) as metrics.jsonl holds it, so that a
    resumed run reports it too."""
    found: dict[str, dict[str, float]] = {}
    for row in read_metrics(run.path):
        if row.get("step") == 0 and "split" in row:
            found[row["split"]] = {k: v for k, v in row.items() if k not in ("step", "split")}
    return found or None


def _heartbeat(run: RunDir | Silent, w: World):
    from ..rundir.owner import Heartbeat

    return Heartbeat(run.path, enabled=w.main)  # only rank 0 owns the run directory


def _train_row(step: int, loss: float, log: StepLog,
               reg: torch.Tensor | None, reg_name: str) -> dict[str, Any]:
    """One training row of metrics.jsonl; a non-finite loss (a step the fp16 loss scaler
    skipped: without it the step raised first) is written as null, and such a step says
    ``"skipped": true``."""
    row: dict[str, Any] = {"step": step, "loss": round(loss, 6) if math.isfinite(loss)
                           else None, "lr": log.lr}
    if log.budget is not None:
        row["budget"] = log.budget
    if reg is not None:  # orth_reg for the SVD and LoRA forms, gate_l1 for SoRA
        row[reg_name] = round(float(reg.detach()), 6)
    if log.skipped:
        row["skipped"] = True
    return row


def _evaluate(built: Built, stepper: Stepper, step: int, logger: RunLogger,
              w: World) -> dict[str, dict[str, float]]:
    """Rank 0 scores every split on the whole data (so the numbers do not depend on the
    number of processes); the other ranks wait for it. A sharded model runs a forward
    only with every process: there they all evaluate along, and rank 0 reports."""
    results: dict[str, dict[str, float]] = {}
    sharded = sharding.enabled(built.cfg)
    if not w.main and not sharded:
        barrier(w)
        return results
    with sharding.evaluating(built.model) if sharded else contextlib.nullcontext():
        _evaluate_splits(built, stepper, step, logger, results)
    barrier(w)
    return results


def scored_splits(cfg: RunConfig, splits: dict[str, Any]) -> dict[str, Any]:
    """The splits an evaluation scores: all of them, but a tune trial scores only the one
    its study reads (``tune.metric``'s), unless ``train.select=best`` reads the others: a
    trial is a point of the search, not a result, and GSM8K's test split alone is 1,319
    generated answers an evaluation."""
    if cfg.tune.metric is None or cfg.train.select == "best":
        return splits
    split = cfg.tune.metric.rpartition("/")[0]
    return {split: splits[split]} if split in splits else splits


def _evaluate_splits(built: Built, stepper: Stepper, step: int, logger: RunLogger,
                     results: dict[str, dict[str, float]]) -> None:
    for split, dataset in scored_splits(built.cfg, built.data.eval_splits).items():
        logger.evaluating(split)
        metrics = built.task.evaluate(
            built.model, split, dataset, batch_size=built.cfg.train.eval_batch_size,
            collate=built.data.collate, device=built.device, autocast=stepper.autocast)
        results[split] = {k: float(v) for k, v in metrics.items()}
        logger.evaluated(step, split, results[split])
        faults.hit("eval", step)
    logger.evaluations_done()


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _save(run: RunDir | Silent, built: Built, stepper: Stepper, generator: torch.Generator,
          pos: ckpt.Position, rngs: list[dict], dataset: dict[str, Any], w: World,
          before_eval: tuple[list, dict] | None = None,
          extra: dict[str, Any] | None = None) -> Path | None:
    """Rank 0 writes a whole checkpoint (the state is the same on every rank); a sharded
    one takes every process. Returns its path on rank 0. ``before_eval``: the RNG states
    and stream sizes from before an evaluation that a stop signal cut short; saved instead
    of the current ones, with the evaluation pending. ``extra``: more of the loop's state
    (the selection of train.select=best)."""
    sharded, keep = sharding.enabled(built.cfg), built.cfg.train.keep_checkpoints
    if not (w.main or sharded):
        return None
    rngs, streams = before_eval if before_eval else (rngs, run.stream_sizes())
    state = {**ckpt.state_of(stepper, generator, pos, rngs, streams,
                             eval_pending=before_eval is not None, sharded=sharded),
             **ckpt.config_record(built.cfg),  # a resume under another config is refused
             DATA_KEY: dataset, **(extra or {})}  # ... and so is one on other data
    if sharded:
        return sharded_checkpoint.save(run.path, pos.step, built.model, stepper.optimizer,
                                       state, keep, w)
    return ckpt.save_checkpoint(run.path, pos.step, trained_state(built.model, built.handle),
                                state, keep=keep)


def _restore(path: Path, built: Built, stepper: Stepper, run: RunDir, w: World,
             selection: best.Selection | None = None) -> ckpt.Position:
    tensors, state = ckpt.load_checkpoint(path)
    if sharding.enabled(built.cfg):
        sharded_checkpoint.load(path, built.model, stepper.optimizer)
    names = {name for name, _ in built.model.named_parameters()}
    unknown = sorted(set(tensors) - names)
    if unknown:
        raise ValueError(f"{path} holds tensors this model lacks ({unknown[0]}); it was "
                         "written for another model or method")
    built.model.load_state_dict(tensors, strict=False)
    pos = ckpt.restore(state, stepper, w.rank)
    lost = run.truncate_streams(state["streams"])
    if lost:  # a log shorter than its checkpoint: cut to whole rows, said, never padded
        warning(lost)
        run.record_resume({}, lost)
    pos.checkpoint_bytes = _size(path)
    if selection is not None and state.get(best.KEY):  # the best so far, and where it is
        selection.restore(state[best.KEY])
        if w.main:
            best.rewind(run.path, pos.step, selection.step)
    return pos
