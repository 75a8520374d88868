"""Memory of the sharded path on the CPU (gloo): how much of the model one process keeps
under ``train.sharding=fsdp`` on 1, 2 and 4 processes, and each process's peak while it
trains, under glibc's default allocator settings and with a fixed mmap threshold.

The model is a BERT-shaped classifier built from its config alone (no download), with
AdaLoRA injected as a run does. As in a sharded run, rank 0 builds the whole model and the
other processes only its shapes (on the meta device); ``engine.sharding.shard``, the
training loop's own call, then shards it and sends every process its rows of rank 0's
weights. Each process measures its resident set size (VmRSS) before the model exists.

Residency (BERT-large's shape by default: 24 layers, hidden 1024, 335M parameters, 1.3 GB
in fp32): what each process keeps of the model once it is sharded, and its peak (VmHWM)
while loading; rank 0 holds the whole model until it is sharded.

Training peak (BERT-base's shape by default: 12 layers, hidden 768, 110M parameters):
after sharding, each process's peak is reset, then it takes ``--steps`` optimizer steps of
the loop's own step (``engine.step.Stepper``: AdamW, the regularizer, the rank allocator)
on its slice of a global batch of random tokens, with cores / N threads as ``--nproc``
gives each rank. Its peak above the pre-model baseline is compared with the one-process
run's. Each round runs once under glibc's defaults (no ``MALLOC_*`` variable in the
processes' environment) and once per ``--malloc`` setting, by default
``MALLOC_MMAP_THRESHOLD_=131072``: glibc then serves every allocation from 128 KiB up with
a mapping of its own and unmaps it when it is freed, instead of raising the threshold as
large blocks are freed and keeping them for reuse. A step's median wall time and CPU time
(steps 2 on; the kernel's share apart: page faults of fresh mappings land there) show what
a setting costs; the CPU time moves less than the wall time on a busy machine.

A benchmark, not a test: numbers depend on the machine (a shared one moves them, the
times more than the sizes), and only the ratios mean something.

    python benchmarks/fsdp_memory.py [--part residency,training] [--procs 1,2,4]
        [--layers 24] [--hidden 1024] [--train-procs 1,2,4] [--train-layers 12]
        [--train-hidden 768] [--batch 4] [--seq 64] [--steps 4]
        [--malloc MALLOC_MMAP_THRESHOLD_=131072 [--malloc VAR=VALUE,...]]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import multiprocessing as mp
import os
import queue
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1 << 20
MALLOC = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
          "MALLOC_MMAP_MAX_", "MALLOC_ARENA_MAX")
"""glibc's tunables read from the environment: unset for the default rounds."""


def _status(key: str) -> int:
    """A VmRSS / VmHWM line of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status (Linux only)")


def _reset_peak() -> None:
    """VmHWM back to the current VmRSS (Linux 4.0 on), so the peak read later is that of
    what ran since."""
    Path("/proc/self/clear_refs").write_text("5")


def _release() -> None:
    """Give freed memory back to the OS, so VmRSS shows what is still held."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: the numbers then include memory merely cached by malloc
        pass


def _config():
    from adalora_cli.config import load_config

    return load_config(str(ROOT / "configs" / "smoke" / "glue.yaml"),
                       ["train.sharding=fsdp", "adalora.init_rank=8", "adalora.budget=8"])


def build(layers: int, hidden: int, meta: bool = False):
    """The classifier with AdaLoRA injected, as ``adalora train`` builds it (``meta``:
    shapes only, as a sharded run's processes but rank 0 build it)."""
    from transformers import BertConfig, BertForSequenceClassification

    from adalora_cli.methods import apply_method

    config = BertConfig(hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=hidden // 64, intermediate_size=4 * hidden,
                        num_labels=2)
    with torch.device("meta") if meta else contextlib.nullcontext():
        model = BertForSequenceClassification(config)
    handle = apply_method(model, _config(), 1000)
    return model, handle


def _prepare() -> int:
    """Import everything and run every code path once on a toy; the VmRSS after."""
    import torch.distributed.fsdp  # noqa: F401
    import transformers
    from transformers.models.bert import modeling_bert  # noqa: F401

    from adalora_cli.engine import sharding, step  # noqa: F401

    transformers.utils.logging.set_verbosity_error()
    build(1, 64)
    _release()
    return _status("VmRSS")


def _sharded(rank: int, world: int, init: str, layers: int, hidden: int):
    """The model, sharded when ``world`` > 1 (after joining the process group)."""
    import torch.distributed as dist

    from adalora_cli.engine import sharding
    from adalora_cli.engine.distributed import World

    model, handle = build(layers, hidden, meta=rank > 0)
    if world > 1:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        sharding.shard(model, handle, World(rank, world, rank), torch.device("cpu"), None)
    return model, handle


def _leave(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def _resident(rank: int, world: int, init: str, job: dict, q) -> None:
    torch.set_num_threads(1)
    before = _prepare()
    model, _ = _sharded(rank, world, init, job["layers"], job["hidden"])
    params = sum(p.numel() for p in model.parameters())
    _release()
    q.put((rank, params, _status("VmRSS") - before, _status("VmHWM") - before))
    _leave(world)


def _train(rank: int, world: int, init: str, job: dict, q) -> None:
    from adalora_cli.engine.distributed import World, shard
    from adalora_cli.engine.precision import decide
    from adalora_cli.engine.step import Stepper

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # as --nproc does
    before = _prepare()
    model, handle = _sharded(rank, world, init, job["layers"], job["hidden"])
    params = sum(p.numel() for p in model.parameters())
    steps, n, seq = job["steps"], job["batch"], job["seq"]
    cfg = _config()
    stepper = Stepper.build(model, handle, cfg.train, steps, decide(cfg, torch.device("cpu")))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (steps, n, seq), generator=g)
    labels = torch.randint(0, 2, (steps, n), generator=g)
    times = []
    _reset_peak()
    for t in range(1, steps + 1):
        mine, weight = shard(list(range(n)), World(rank, world, rank))
        batch = {"input_ids": ids[t - 1, mine], "labels": labels[t - 1, mine],
                 "attention_mask": torch.ones(len(mine), seq, dtype=torch.long)}
        start, cpu = time.perf_counter(), os.times()
        stepper.backward(batch, weight)
        stepper.update(t)
        now = os.times()
        times.append((time.perf_counter() - start,
                      now.user + now.system - cpu.user - cpu.system, now.system - cpu.system))
    seen = {k: os.environ[k] for k in MALLOC if k in os.environ}  # what glibc read
    q.put((rank, params, _status("VmHWM") - before, times, seen))
    _leave(world)


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` and no other glibc tunable in the environment the processes start with."""
    saved = {k: os.environ.pop(k) for k in MALLOC if k in os.environ}
    os.environ.update(env)
    try:
        yield
    finally:
        for k in env:
            os.environ.pop(k, None)
        os.environ.update(saved)


def measure(target: Callable, world: int, job: dict,
            env: dict[str, str] | None = None) -> list[tuple]:
    ctx = mp.get_context("spawn")  # fresh processes: nothing resident from an earlier round
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp, _environment(env or {}):
        init = f"file://{tmp}/store"
        procs = [ctx.Process(target=target, args=(r, world, init, job, q), daemon=True)
                 for r in range(world)]
        for p in procs:
            p.start()
        rows = []
        while len(rows) < world:
            try:
                rows.append(q.get(timeout=5))
            except queue.Empty:
                failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if failed:
                    raise SystemExit(f"a process of the {world}-process round failed "
                                     f"(exit {failed[0]}); its traceback is above") from None
        for p in procs:
            p.join()
    return sorted(rows)


def residency(worlds: list[int], layers: int, hidden: int) -> None:
    print(f"BERT-shaped classifier, {layers} layers, hidden {hidden}, AdaLoRA r0=8; "
          "resident model per process after sharding (peak while loading):")
    one = None
    job = {"layers": layers, "hidden": hidden}
    for world in worlds:
        rows = measure(_resident, world, job)
        kept = max(r[2] for r in rows)  # the process that keeps the most
        one = one or (kept if world == 1 else None)
        ratio = f"{kept / one:.2f}x one process" if one else "(no 1-process baseline)"
        others = (f", the others {max(r[3] for r in rows[1:]) / MiB:.0f} MiB"
                  if world > 1 else "")
        print(f"  {world} process{'es' if world > 1 else ''}: {kept / MiB:7.0f} MiB kept, "
              f"{ratio} (ideal {1 / world:.2f}x); peak: rank 0 {rows[0][3] / MiB:.0f} MiB"
              f"{others}; {rows[0][1] / 1e6:.0f}M parameters", flush=True)


def training(worlds: list[int], job: dict, settings: list[str]) -> None:
    from adalora_cli import threads

    threads.apply_defaults()  # OpenMP's wait policy as adalora sets it, decided once
    print(f"BERT-shaped classifier, {job['layers']} layers, hidden {job['hidden']}, AdaLoRA "
          f"r0=8, fp32; {job['steps']} steps of a global batch of {job['batch']} x "
          f"{job['seq']} tokens, cores / N threads per process ({os.cpu_count()} cores, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}); "
          "training peak per process above its pre-model RSS (ratio to 1 process under "
          "glibc's defaults); a step's median wall and CPU time (in the kernel):")
    one = None
    for setting in ["", *settings]:
        env = dict(pair.split("=", 1) for pair in setting.split(",") if pair)
        print(f"  {setting or 'glibc defaults'}:", flush=True)
        for world in worlds:
            rows = measure(_train, world, job, env)
            peaks = [r[2] for r in rows]
            one = one or (peaks[0] if world == 1 else None)
            steps = [t for r in rows for t in r[3][1:] or r[3]]  # the first: one-off setup
            wall, cpu, system = (statistics.median(t[i] for t in steps) for i in range(3))
            each = ", ".join(f"{p / MiB:.0f}" + (f" ({p / one:.2f}x)" if one else "")
                             for p in peaks)
            print(f"    {world} process{'es' if world > 1 else '  '}: {each} MiB; step "
                  f"{wall:.2f} s, CPU {cpu:.2f} s ({system:.2f} s); "
                  f"{rows[0][1] / 1e6:.0f}M parameters", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", default="residency,training",
                        help="residency, training, or both (comma-separated)")
    parser.add_argument("--procs", default="1,2,4")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--train-procs", default="1,2,4")
    parser.add_argument("--train-layers", type=int, default=12)
    parser.add_argument("--train-hidden", type=int, default=768)
    parser.add_argument("--batch", type=int, default=4, help="global batch (examples)")
    parser.add_argument("--seq", type=int, default=64, help="tokens per example")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--malloc", action="append",
                        help="glibc settings to train under besides its defaults, VAR=VALUE "
                             "joined by commas; repeat for more (default: "
                             "MALLOC_MMAP_THRESHOLD_=131072)")
    args = parser.parse_args()
    parts = set(args.part.split(","))
    if not parts <= {"residency", "training"}:
        parser.error(f"--part takes residency and/or training, not {args.part}")
    if "residency" in parts:
        residency([int(n) for n in args.procs.split(",")], args.layers, args.hidden)
    if "training" in parts:
        job = {"layers": args.train_layers, "hidden": args.train_hidden, "steps": args.steps,
               "batch": args.batch, "seq": args.seq}
        settings = args.malloc or ["MALLOC_MMAP_THRESHOLD_=131072"]
        bad = [p for s in settings for p in s.split(",")
               if "=" not in p or p.split("=")[0] not in MALLOC]
        if bad:
            parser.error(f"--malloc takes {', '.join(MALLOC)} as VAR=VALUE, not {bad[0]}")
        training([int(n) for n in args.train_procs.split(",")], job, settings)


if __name__ == "__main__":
    main()
