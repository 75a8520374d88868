"""``--slurm key=value,...``: what one SLURM job of a sweep asks the scheduler for.

One frozen dataclass, parsed from the command line with one-line errors, and turned into
submitit's ``SlurmExecutor`` parameters (which become the ``#SBATCH`` lines). Anything
submitit has no name for goes through ``sbatch.<flag>=<value>``, written as
``#SBATCH --<flag>=<value>`` as it is.

Commas separate items only where the next item starts with ``key=``, so a value may hold
commas of its own: ``sbatch.exclude=node1,node2,partition=gpu`` is two items.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ConfigError

KEYS = ("partition", "time", "gpus_per_job", "nodes", "cpus", "mem", "account", "qos",
        "constraint", "parallel", "signal_delay", "requeues")
_ITEM_SPLIT = re.compile(r",(?=\s*[A-Za-z_][\w.-]*=)")
_MEM = re.compile(r"^(\d+)([KMGT]?)B?$", re.IGNORECASE)


@dataclass(frozen=True)
class SlurmOptions:
    """One array task = one run; every field applies to each task."""

    time_min: int | None = None
    """Wall-clock limit in minutes (``time=24:00:00``). Required: submitit always writes
    ``--time``, and its default (5 minutes) is never what a training run wants."""
    partition: str | None = None
    gpus_per_job: int = 1
    """GPUs of one run; above 1 the run is a ``torchrun`` with one process per GPU."""
    nodes: int = 1
    """Nodes of one run; above 1 each node starts a ``torchrun`` agent (``srun``, one task a
    node) that meets the others at a c10d rendezvous on the job's first node, with
    ``gpus_per_job`` processes (one on a CPU job) on each."""
    cpus: int | None = None
    """CPUs of one run (``--cpus-per-task``)."""
    mem: str | None = None
    """Memory of one run in SLURM's spelling (``64G``, ``16000M``; a bare number is MB)."""
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    parallel: int | None = None
    """At most this many array tasks at once (``--array=0-N%parallel``)."""
    signal_delay: int = 120
    """Seconds before the time limit that a job is told to checkpoint and requeue."""
    requeues: int = 3
    """How often one run may be requeued after hitting its time limit; above 0 the jobs
    are also submitted with ``--requeue``, so SLURM requeues them after preemption."""
    sbatch: dict[str, str | bool] = field(default_factory=dict)
    """Extra ``#SBATCH --flag=value`` lines (``True``: a bare ``--flag``)."""


def parse_time(text: str) -> int:
    """SLURM's time formats -> whole minutes (rounded up): ``M``, ``M:S``, ``H:M:S``,
    ``D-H``, ``D-H:M``, ``D-H:M:S``."""
    days, _, rest = text.strip().rpartition("-") if "-" in text else ("0", "", text.strip())
    parts = rest.split(":")
    try:
        d, nums = int(days), [int(p) for p in parts]
    except ValueError:
        nums, d = [], 0
    if not nums or len(nums) > 3 or any(n < 0 for n in nums) or d < 0:
        raise ConfigError(f"--slurm time={text}: not a SLURM time; use e.g. time=24:00:00, "
                          "time=90 (minutes) or time=2-00:00:00")
    if "-" in text:  # D-H, D-H:M, D-H:M:S
        h, m, s = (nums + [0, 0])[:3]
    elif len(nums) == 3:
        h, m, s = nums
    else:  # M or M:S
        h, (m, s) = 0, (nums + [0])[:2]
    seconds = ((d * 24 + h) * 60 + m) * 60 + s
    if seconds <= 0:
        raise ConfigError(f"--slurm time={text}: the time limit must be positive")
    return -(-seconds // 60)


def _mem(text: str) -> str:
    match = _MEM.match(text.strip())
    if not match or int(match.group(1)) <= 0:
        raise ConfigError(f"--slurm mem={text}: not a memory size; use a whole number with "
                          "a unit, e.g. mem=64G or mem=16000M")
    return f"{int(match.group(1))}{match.group(2).upper()}"


def _int(key: str, text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise ConfigError(f"--slurm {key}={text}: must be an integer >= {minimum}")
    return value


def _item(key: str, value: str, fields: dict, extra: dict) -> None:
    if key.startswith("sbatch."):
        flag = key[len("sbatch."):].lstrip("-")
        if not flag:
            raise ConfigError(f"--slurm {key}={value}: name the flag, e.g. "
                              "sbatch.mail-type=END")
        extra[flag] = value if value else True
        return
    if key not in KEYS:
        raise ConfigError(f"--slurm: unknown key {key!r}; valid keys: {', '.join(KEYS)}, and "
                          "sbatch.<flag>=<value> for any other sbatch option")
    if not value:
        raise ConfigError(f"--slurm {key}= needs a value, e.g. {key}={_EXAMPLES[key]}")
    converters = {
        "time": lambda v: ("time_min", parse_time(v)),
        "gpus_per_job": lambda v: ("gpus_per_job", _int(key, v, 0)),
        "nodes": lambda v: ("nodes", _int(key, v, 1)),
        "cpus": lambda v: ("cpus", _int(key, v, 1)),
        "mem": lambda v: ("mem", _mem(v)),
        "parallel": lambda v: ("parallel", _int(key, v, 1)),
        "signal_delay": lambda v: ("signal_delay", _int(key, v, 10)),
        "requeues": lambda v: ("requeues", _int(key, v, 0)),
    }
    name, converted = converters.get(key, lambda v: (key, v))(value)
    fields[name] = converted


_EXAMPLES = {"partition": "gpu", "time": "24:00:00", "gpus_per_job": "1", "nodes": "2",
             "cpus": "8", "mem": "64G", "account": "myproject", "qos": "normal",
             "constraint": "a100", "parallel": "16", "signal_delay": "120", "requeues": "3"}


def parse_slurm(items: list[str]) -> SlurmOptions:
    """``["partition=gpu,time=24:00:00", "gpus_per_job=2"]`` -> :class:`SlurmOptions`."""
    fields: dict = {}
    extra: dict[str, str | bool] = {}
    for text in items:
        for part in _ITEM_SPLIT.split(text):
            if not part.strip():
                continue
            key, eq, value = part.partition("=")
            if not eq:
                raise ConfigError(f"--slurm {part!r} is not key=value; e.g. --slurm "
                                  "partition=gpu,time=24:00:00,gpus_per_job=1")
            _item(key.strip(), value.strip(), fields, extra)
    if fields.get("time_min") is None:
        raise ConfigError("--launcher slurm needs the jobs' time limit: add --slurm "
                          "time=HH:MM:SS (e.g. time=24:00:00)")
    return SlurmOptions(**fields, sbatch=extra)


def sbatch_refusal(err: BaseException, opts: SlurmOptions) -> ConfigError | None:
    """sbatch's refusal of the jobs (submitit's FailedJobError, from sbatch's non-zero exit
    and its stderr) as one line: sbatch's own error and what to change; None for any
    other error. The usual one: ``gpus_per_job`` (default 1) on nodes without GPUs, which
    sbatch calls an invalid generic resource (gres)."""
    cause = err.__cause__  # submitit raises from the CalledProcessError of its command
    if not isinstance(cause, subprocess.CalledProcessError) or not isinstance(
            cause.cmd, (list, tuple)) or Path(str(cause.cmd[0])).name != "sbatch":
        return None
    lines = [line.strip() for line in str(cause.stderr or err).splitlines() if line.strip()]
    said = next((line for line in lines if "error" in line.lower()), lines[0] if lines else
                "sbatch failed without a message")
    said = re.sub(r"^sbatch:\s*error:\s*", "", said)
    gres = re.search(r"\bgres\b|generic resource", "\n".join(lines), re.IGNORECASE)
    if opts.gpus_per_job and gres:  # the jobs' GPUs are their only generic resource
        n = opts.gpus_per_job
        fix = (f"each job asks for {n} GPU{'s' if n > 1 else ''} (--slurm gpus_per_job={n}"
               f"{', the default' if n == 1 else ''}): on nodes without GPUs submit CPU jobs "
               "with --slurm gpus_per_job=0, or pick a partition with GPUs (--slurm "
               "partition=...)")
    else:
        fix = ("change what it names in --slurm (sbatch.<flag>=<value> passes any other "
               "sbatch option) and run the sweep again")
    return ConfigError(f"sbatch refused the sweep's jobs, so none was submitted: {said}; "
                       f"{fix}")


def executor_parameters(opts: SlurmOptions, job_name: str) -> dict:
    """submitit ``SlurmExecutor.update_parameters`` arguments for these options."""
    params: dict = {"job_name": job_name, "time": opts.time_min, "nodes": opts.nodes,
                    "ntasks_per_node": 1, "signal_delay_s": opts.signal_delay}
    # One task per node of a run: with several GPUs or nodes that task starts torchrun,
    # which starts the node's ranks.
    if opts.gpus_per_job:
        params["gpus_per_node"] = opts.gpus_per_job
    optional = {"partition": opts.partition, "cpus_per_task": opts.cpus,
                "mem": opts.mem, "account": opts.account, "qos": opts.qos,
                "constraint": opts.constraint, "array_parallelism": opts.parallel}
    params.update({k: v for k, v in optional.items() if v is not None})
    extra = dict(opts.sbatch)
    # A run is meant to come back after preemption or a node failure: SLURM requeues a job
    # only with --requeue (clusters differ in their default), and the job resumes from its
    # checkpoint. The user's own sbatch.requeue / sbatch.no-requeue wins.
    if opts.requeues > 0 and "requeue" not in extra and "no-requeue" not in extra:
        extra["requeue"] = True
    if extra:
        params["additional_parameters"] = extra
    return params
