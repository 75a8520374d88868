"""Memory of the sharded path: how much of the frozen base one process keeps resident under
``train.sharding=fsdp`` on 1, 2 and 4 CPU processes (gloo), with the ratio to one process.

The model is a BERT-large-shaped classifier built from its config alone (no download): 24
layers, hidden 1024, about 335M parameters, 1.3 GB in fp32, with AdaLoRA injected as a
run does. As in a sharded run, rank 0 builds the whole model and the other processes only
its shapes (on the meta device); ``engine.sharding.shard``, the training loop's own call,
then shards it and sends every process its rows of rank 0's weights. Each process
measures its resident set size (VmRSS) before the model exists and again once it is
sharded; the difference is what that process keeps of the model. The peak (VmHWM) is
printed too, rank 0's apart: it holds the whole model until it is sharded.

A benchmark, not a test: numbers depend on the machine (a shared one moves them), and
only the ratios mean something.

    python benchmarks/fsdp_memory.py [--procs 1,2,4] [--layers 24] [--hidden 1024]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import multiprocessing as mp
import queue
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1 << 20


def _status(key: str) -> int:
    """A VmRSS / VmHWM line of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status (Linux only)")


def _release() -> None:
    """Give freed memory back to the OS, so VmRSS shows what is still held."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: the numbers then include memory merely cached by malloc
        pass


def build(layers: int, hidden: int, meta: bool = False):
    """The classifier with AdaLoRA injected, as ``adalora train`` builds it (``meta``:
    shapes only, as a sharded run's processes but rank 0 build it)."""
    import contextlib

    from transformers import BertConfig, BertForSequenceClassification

    from adalora_cli.config import load_config
    from adalora_cli.methods import apply_method

    config = BertConfig(hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=hidden // 64, intermediate_size=4 * hidden,
                        num_labels=2)
    with torch.device("meta") if meta else contextlib.nullcontext():
        model = BertForSequenceClassification(config)
    cfg = load_config(str(ROOT / "configs" / "smoke" / "glue.yaml"),
                      ["train.sharding=fsdp", "adalora.init_rank=8", "adalora.budget=8"])
    handle = apply_method(model, cfg, 1000)
    return model, handle


def _rank(rank: int, world: int, init: str, layers: int, hidden: int, q) -> None:
    import torch.distributed as dist
    import torch.distributed.fsdp  # noqa: F401  (everything imported before measuring)
    import transformers
    from transformers.models.bert import modeling_bert  # noqa: F401

    from adalora_cli.config import load_config  # noqa: F401
    from adalora_cli.engine import sharding
    from adalora_cli.engine.distributed import World
    from adalora_cli.methods import apply_method  # noqa: F401

    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(1)
    build(1, 64)  # first use of every code path, on a toy of the same model
    _release()
    before = _status("VmRSS")
    model, handle = build(layers, hidden, meta=rank > 0)
    params = sum(p.numel() for p in model.parameters())
    if world > 1:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        sharding.shard(model, handle, World(rank, world, rank), torch.device("cpu"), None)
    _release()
    q.put((rank, params, _status("VmRSS") - before, _status("VmHWM") - before))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def measure(world: int, layers: int, hidden: int) -> list[tuple[int, int, int, int]]:
    ctx = mp.get_context("spawn")  # fresh processes: nothing resident from an earlier round
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/store"
        procs = [ctx.Process(target=_rank, args=(r, world, init, layers, hidden, q),
                             daemon=True) for r in range(world)]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", default="1,2,4")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=1024)
    args = parser.parse_args()
    worlds = [int(n) for n in args.procs.split(",")]
    print(f"BERT-shaped classifier, {args.layers} layers, hidden {args.hidden}, AdaLoRA r0=8; "
          "resident model per process after sharding (peak while loading):")
    one = None
    for world in worlds:
        rows = measure(world, args.layers, args.hidden)
        kept = max(r[2] for r in rows)  # the process that keeps the most
        one = one or (kept if world == 1 else None)
        ratio = f"{kept / one:.2f}x one process" if one else "(no 1-process baseline)"
        others = (f", the others {max(r[3] for r in rows[1:]) / MiB:.0f} MiB"
                  if world > 1 else "")
        print(f"  {world} process{'es' if world > 1 else ''}: {kept / MiB:7.0f} MiB kept, "
              f"{ratio} (ideal {1 / world:.2f}x); peak: rank 0 {rows[0][3] / MiB:.0f} MiB"
              f"{others}; {rows[0][1] / 1e6:.0f}M parameters", flush=True)


if __name__ == "__main__":
    main()
