"""Every file name of a run directory and of a sweep directory, in one place.

A run directory is everything one ``adalora train`` leaves behind.

Layout (all names fixed, so reports can rely on them)::

    config.yaml         resolved config
    status.json         {"status": running|preempted|failed|finished, owner, ...}; failed
                        runs carry the error
    heartbeat.json      a live run's last step and time, rewritten every 30 s
    checkpoints/step-N/ the training state to resume from (kept while a run is unfinished)
    metrics.jsonl       one JSON object per line: training rows and eval rows
    rank_history.jsonl  AdaLoRA: per-matrix ranks at every mask event
    rank_pattern.json   AdaLoRA: {module path: final rank}
    rank_heatmap.png    AdaLoRA: final rank per layer and matrix type (paper Figure 3)
    adapter_model.safetensors   trained adapter + head (or model/ for method 'full')
    summary.json        written last: its presence means the run finished
    eval/<name>.json    later re-scoring with adalora eval (never touches the above)
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
LOCK = ".lock"
EVAL = "eval"
"""``adalora eval`` writes ``eval/<name>.json`` (and predictions in ``eval/<name>/``)."""
LAUNCH = "launch.json"
"""Written by the sweep that is starting a run's process, so another sweep leaves it alone."""
STREAMS = (METRICS, RANK_HISTORY)
"""Append-only files that a resumed run cuts back to their length at its checkpoint."""
TRACKERS = "trackers.json"
"""With ``log.to``: each tracker's run id, so a resumed run reattaches to it."""
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"

# A sweep directory: the manifest, one event per line, SLURM job records, submitit's files.
SWEEP_LOG = "sweep_log.jsonl"
SWEEP_MANIFEST = "sweep.yaml"
SLURM_RECORDS = "slurm_jobs.json"
SUBMITIT_DIR = "slurm"
