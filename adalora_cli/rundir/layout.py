"""Every file name of a run directory and of a sweep directory, in one place.

A run directory is everything one ``adalora train`` leaves behind.

Layout (all names fixed, so reports can rely on them)::

    config.yaml         resolved config
    status.json         {"status": running|preempted|failed|finished, owner, ...}; failed
                        runs carry the error
    heartbeat.json      a live run's last step and time, rewritten every 30 s; removed
                        when the run ends (finished, preempted or failed)
    checkpoints/step-N/ the training state to resume from (kept while a run is unfinished):
                        trainable.safetensors and state.pt (train.sharding=fsdp:
                        sharded/, each process's rows, and state.pt)
    best/step-N/        train.select=best: the weights and rank controller state of the best
                        evaluation so far (kept while a run is unfinished)
    metrics.jsonl       one JSON object per line: training rows and eval rows
    rank_history.jsonl  AdaLoRA: per-matrix ranks at every mask event
    rank_pattern.json   AdaLoRA: {module path: final rank}
    rank_heatmap.png    AdaLoRA: final rank per layer and matrix type (paper Figure 3)
    adapter_model.safetensors   trained adapter + head (or model/ for method 'full')
    summary.json        written last: its presence means the run finished
    allocator_state.pt  AdaLoRA: importance averages and mask (what an export keeps)
    predictions.json    SQuAD: {id: answer} (predictions_<split>.json with several splits)
    predictions.jsonl   summarization, causal_lm (when generating): one row per example
    eval/<name>.json    later re-scoring with adalora eval (never touches the above)
    harness.json        lm-evaluation-harness scores (eval.harness, or adalora eval --harness):
                        {"adapted": {task: {metric: value}}, "base": ...}
    harness/            each harness task's scored rows: <model>-<task>.jsonl (model adapted
                        or base; prompt, response, target)
    trackers.json       with log.to: each tracker's run id, so a resumed run reattaches
    tensorboard/        with log.to=[tensorboard]: the event files
    wandb/              with log.to=[wandb]: W&B's local run folders

A run is finished only when ``summary.json`` exists and ``status.json`` says so; a crash
or a bad input leaves ``status: failed`` with the error, never a finished-looking run.
Claiming a directory (a new run, or resuming one) happens under an exclusive lock on
``.lock``, so two processes never both own one run.
"""

SUMMARY = "summary.json"
STATUS = "status.json"
METRICS = "metrics.jsonl"
CONFIG = "config.yaml"
RANK_PATTERN = "rank_pattern.json"
RANK_HISTORY = "rank_history.jsonl"
HEATMAP = "rank_heatmap.png"
WEIGHTS = "adapter_model.safetensors"
ALLOCATOR_STATE = "allocator_state.pt"
FULL_MODEL = "model"
HEARTBEAT = "heartbeat.json"
CHECKPOINTS = "checkpoints"
CHECKPOINT_TENSORS = "trainable.safetensors"
"""In ``checkpoints/step-N/``: the trainable tensors."""
CHECKPOINT_STATE = "state.pt"
"""In ``checkpoints/step-N/``: optimizer, scheduler, allocator, RNGs, data order, streams."""
CHECKPOINT_SHARDED = "sharded"
"""In ``checkpoints/step-N/`` of a ``train.sharding=fsdp`` run, instead of
CHECKPOINT_TENSORS: the torch.distributed.checkpoint files of the trained tensors and the
optimizer state, each process's rows."""
BEST = "best"
"""With ``train.select=best``: ``best/step-N/`` holds the trained tensors
(BEST_TENSORS) and the rank controller's state (BEST_CONTROLLER) of the best evaluation so
far, and ``best/records.json`` which of them each kept checkpoint resumes to."""
BEST_TENSORS = "trained.safetensors"
BEST_CONTROLLER = "controller.pt"
BEST_RECORDS = "records.json"
PREDICTIONS = "predictions.json"
"""SQuAD's answers, ``{id: answer}``, the format the official scripts read."""
PREDICTIONS_JSONL = "predictions.jsonl"
"""Summarization and causal_lm: one JSON object per evaluated example."""


def split_predictions(split: str) -> str:
    """SQuAD's answers when a run evaluates several splits: one file per split."""
    return f"predictions_{split}.json"


LOCK = ".lock"
EVAL = "eval"
"""``adalora eval`` writes ``eval/<name>.json`` (and predictions in ``eval/<name>/``)."""
HARNESS = "harness.json"
"""lm-evaluation-harness scores of the adapted (and base) model, by task and metric."""
HARNESS_SAMPLES = "harness"
"""``harness/<model>-<task>.jsonl``: the rows each harness task scored."""
LAUNCH = "launch.json"
"""Written by the sweep that is starting a run's process, so another sweep leaves it alone."""
STREAMS = (METRICS, RANK_HISTORY)
"""Append-only files that a resumed run cuts back to their length at its checkpoint."""
TRACKERS = "trackers.json"
"""With ``log.to``: each tracker's run id, so a resumed run reattaches to it."""
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
RUN_NAMES = (CONFIG, STATUS, HEARTBEAT, METRICS, RANK_HISTORY, RANK_PATTERN, HEATMAP, WEIGHTS,
             ALLOCATOR_STATE, FULL_MODEL, SUMMARY, CHECKPOINTS, PREDICTIONS, PREDICTIONS_JSONL,
             EVAL, TRACKERS, TENSORBOARD_DIR, WANDB_DIR, LOCK, LAUNCH, BEST, HARNESS,
             HARNESS_SAMPLES)
"""Every name a run writes at the top of its directory (SQuAD's per-split predictions
aside)."""

# A sweep directory: the run directories, the manifest, one event per line, each run's
# training output, SLURM job records and submitit's files.
SWEEP_LOG = "sweep_log.jsonl"
SWEEP_LOGS = "logs"
"""``logs/<run>.log``: every attempt's output of one run, appended."""
SWEEP_MANIFEST = "sweep.yaml"
SLURM_RECORDS = "slurm_jobs.json"
SUBMITIT_DIR = "slurm"
SWEEP_FILES = (SWEEP_LOG, SWEEP_MANIFEST, SWEEP_LOGS, SLURM_RECORDS, SUBMITIT_DIR)
"""The names of a sweep directory; every other name here belongs to a run directory."""
