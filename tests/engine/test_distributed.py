"""One run on two processes (torchrun, gloo, CPU) reproduces the same run on one.

The tiny model's dropout is switched off, so 2 processes x per-rank batch 8 and 1 process x
batch 16 compute the same gradients up to float rounding: the loss curve, the budget rows,
the rank pattern and the final metrics must agree.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from adalora_cli.engine.distributed import World, per_rank_batch, shard
from adalora_cli.rundir.run import RunDir, read_metrics

from .conftest import ROOT, SMOKE, forked


def args(model: Path, out: Path, *extra: str) -> list[str]:
    return ["train", SMOKE, f"model.name_or_path={model}", "train.batch_size=16",
            "train.epochs=8", *extra, "--run-dir", str(out), "--quiet"]


def adalora(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "adalora_cli", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def left_in(temp: Path) -> list[str]:
    """What a run left in its TMPDIR, less torch's own compile cache: importing
    ``torch._dynamo`` (transformers' masking_utils does) creates ``torchinductor_<user>``
    there, one folder shared by every later process of that user, not a per-run leftover."""
    return sorted(p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_"))


def assert_same_run(one: Path, two: Path) -> None:
    a, b = read_metrics(one), read_metrics(two)
    assert [sorted(r) for r in a] == [sorted(r) for r in b]
    train_a, train_b = [r for r in a if "loss" in r], [r for r in b if "loss" in r]
    assert [r["step"] for r in train_a] == list(range(1, 33))
    assert [r["loss"] for r in train_b] == pytest.approx([r["loss"] for r in train_a],
                                                         abs=2e-6)
    assert [r["budget"] for r in train_b] == [r["budget"] for r in train_a]
    assert [r["lr"] for r in train_b] == [r["lr"] for r in train_a]
    for name in ("rank_pattern.json", "rank_history.jsonl"):
        assert (one / name).read_text() == (two / name).read_text()
    metrics = [json.loads((p / "summary.json").read_text())["metrics"] for p in (one, two)]
    assert metrics[0] == metrics[1]


@pytest.fixture(scope="module")
def one_process(no_dropout, tmp_path_factory, warm) -> Path:
    out = tmp_path_factory.mktemp("one") / "run"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert forked(args(no_dropout, out)) == 0
    finally:
        os.chdir(cwd)
    return out


@pytest.mark.e2e
def test_two_processes_reproduce_one(no_dropout, one_process, tmp_path):
    out, temp = tmp_path / "two", tmp_path / "tmp"
    temp.mkdir()
    proc = adalora(*args(no_dropout, out), "--nproc", "2", env={"TMPDIR": str(temp)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("run directory:") == 1  # rank 0 speaks for the run
    assert left_in(temp) == []  # the launcher's error-file folder went with it
    assert_same_run(one_process, out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_steps"] == 32  # T from the global batch: 64 / 16 x 8 epochs


@pytest.mark.e2e
def test_resume_on_another_number_of_processes(no_dropout, one_process, tmp_path):
    """Killed on one process after step 14, finished on two: the same run."""
    out = tmp_path / "run"
    os.chdir(ROOT)
    assert forked(args(no_dropout, out, "train.save_every=3"), "kill@step=14") == -9
    proc = adalora("train", "--resume", str(out), "--quiet", "--nproc", "2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("note: resuming on 2 processes a checkpoint written by 1:") == 1
    assert_same_run(one_process, out)


@pytest.mark.e2e
def test_a_two_process_checkpoint_resumes_on_one_and_says_what_carries_over(
        no_dropout, one_process, tmp_path):
    """Stopped on two processes in step 14 (last checkpoint: step 12), finished on one:
    without dropout the one thing that cannot carry over is absent, so it is the same run;
    the resume says in one note what is exact and records the change in status.json."""
    out = tmp_path / "run"
    first = adalora(*args(no_dropout, out, "train.save_every=3"), "--nproc", "2",
                    env={"ADALORA_FAULT": "term@midstep=14"})
    assert first.returncode == 75, first.stderr
    proc = adalora("train", "--resume", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: resuming on 1 process a checkpoint written by 2: the weights, optimizer, lr "
        "and budget schedules, rank allocator and data order carry on exactly, but each "
        "process's random stream (dropout) and the sum of gradients over processes cannot, "
        "so the run matches an uninterrupted one only up to those (recorded in status.json)"]
    resumes = RunDir.read_status(out)["resumes"]
    assert [(r["attempt"], r["processes"]) for r in resumes] == [(2, [2, 1])]
    assert_same_run(one_process, out)


@pytest.mark.e2e
def test_length_split_reproduces_the_whole_batch(no_dropout, one_process, tmp_path):
    """train.length_split (engine/split.py) on one process, and combined with two ranks:
    each batch of 16 (or each rank's 8) run as length-sorted pieces is the same run."""
    out = tmp_path / "split"
    os.chdir(ROOT)
    assert forked(args(no_dropout, out, "train.length_split=4")) == 0
    assert_same_run(one_process, out)
    both = tmp_path / "split-two"
    proc = adalora(*args(no_dropout, both, "train.length_split=3"), "--nproc", "2")
    assert proc.returncode == 0, proc.stderr
    assert_same_run(one_process, both)


@pytest.mark.e2e
def test_a_batch_that_does_not_divide_is_refused_before_launch(tmp_path):
    proc = adalora("train", SMOKE, "train.batch_size=9", "--nproc", "2", "--run-dir",
                   str(tmp_path / "run"))
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["error: train.batch_size=9 is the global batch and must divide by the "
                     "2 processes; use a multiple of 2"]
    assert not (tmp_path / "run").exists()


def test_shards_cover_the_batch_and_weights_give_the_global_mean():
    batch = list(range(7))
    shards = [shard(batch, World(r, 3, r)) for r in range(3)]
    assert [s for s, _ in shards] == [[0, 1], [2, 3], [4, 5, 6]]
    losses = [torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])[s].mean() for s, _ in shards]
    ddp = sum(loss * w for loss, (_, w) in zip(losses, shards)) / 3  # DDP averages ranks
    assert float(ddp) == pytest.approx(4.0)  # the mean of 1..7
    # a last batch smaller than the world: the empty rank runs one example at weight 0,
    # the other carries it at weight 2, so DDP's average (0 + 2 l) / 2 is its loss l
    assert shard([9], World(0, 2, 0)) == ([9], 0.0)
    assert shard([9], World(1, 2, 1)) == ([9], 2.0)
    assert per_rank_batch(16, World(0, 4, 0)) == 4


def _mask_worker(rank: int, init: str, diverge: bool, out: str) -> None:
    import torch.distributed as dist

    from adalora_cli.engine.distributed import check_masks
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    mask = torch.ones(12)
    if diverge and rank == 1:
        mask[5] = 0.0
    try:
        check_masks(mask, 7, World(rank, 2, rank))
        result = "ok"
    except RuntimeError as err:
        result = str(err)
    Path(out, f"rank{rank}").write_text(result)
    dist.destroy_process_group()


@pytest.mark.e2e
@pytest.mark.parametrize("diverge", [False, True])
def test_mask_checksums_are_compared_across_ranks(tmp_path, diverge):
    import multiprocessing as mp

    init = f"file://{tmp_path / 'store'}"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_mask_worker, args=(r, init, diverge, str(tmp_path)))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    results = [(tmp_path / f"rank{r}").read_text() for r in range(2)]
    if not diverge:
        assert results == ["ok", "ok"]
    else:
        expected = ("AdaLoRA masks diverged across processes at step 7 (rank 0: 12 kept / "
                    "checksum 78, rank 1: 11 kept / checksum 72)")
        assert results == [expected, expected]


def _allocator_worker(rank: int, init: str, handle, from_rank0: bool, out: str) -> None:
    """One rank of a tiny AdaLoRA model (built before the fork: the same weights and
    gradients on both ranks) whose importance averages then differ by rank, as CUDA's
    unordered reductions make them differ, only more; then a mask event. Writes the mask the
    rank ended with and the one its own scores chose."""
    import torch.distributed as dist

    from adalora_cli.engine.distributed import check_masks, masks_from_rank0

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    w = World(rank, 2, rank)
    allocator = handle.allocator
    if from_rank0:
        masks_from_rank0(allocator, w)
    noise = torch.Generator().manual_seed(100 + rank)
    allocator.U_bar.mul_(1 + torch.rand(allocator.U_bar.shape, generator=noise))
    report = allocator.step(3)  # b(3) = 10 + floor(38 * 4^3 / 5^3) = 29 triplets kept
    own = torch.zeros_like(allocator.mask)
    own[torch.argsort(allocator.scores(), descending=True, stable=True)[:29]] = 1.0
    try:
        check_masks(allocator.mask, 3, w)
        guard = "ok"
    except RuntimeError as err:
        guard = str(err)
    torch.save({"mask": allocator.mask.clone(), "own": own, "ranks": report.ranks,
                "guard": guard}, Path(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.e2e
@pytest.mark.parametrize("from_rank0", [True, False])
def test_masks_are_rank_0_s_choice_even_where_scores_differ(tmp_path, from_rank0):
    import multiprocessing as mp

    from adalora_cli.methods import apply_method
    from tests.methods._tiny import run_config, tiny_batch, tiny_bert

    model = tiny_bert(0)
    cfg = run_config("adalora", adalora={"budget": 10, "t_init": 2, "t_final": 3,
                                         "delta_t": 1})
    handle = apply_method(model, cfg, 10)
    torch.manual_seed(1)
    for _, layer in handle.layers:  # lam = 0 (its start) would give every entry score 0
        layer.lam.data.normal_()
    model(**tiny_batch(1)).loss.backward()
    handle.allocator.step(1)  # warm-up: scores only, the same on both ranks

    init = f"file://{tmp_path / 'store'}"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_allocator_worker,
                         args=(r, init, handle, from_rank0, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    zero, one = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert not torch.equal(zero["own"], one["own"])  # the ranks' scores disagree
    assert int(zero["own"].sum()) == int(one["own"].sum()) == 29
    if from_rank0:  # as the loop sets it up: rank 0's choice everywhere
        assert torch.equal(zero["mask"], zero["own"]) and torch.equal(one["mask"], zero["own"])
        assert zero["ranks"] == one["ranks"] and sum(zero["ranks"].values()) == 29
        assert zero["guard"] == one["guard"] == "ok"
    else:  # each rank on its own: the masks diverge, and the guard says so
        assert torch.equal(one["mask"], one["own"])
        assert zero["guard"].startswith("AdaLoRA masks diverged across processes at step 3")


@pytest.mark.e2e
def test_a_rank_side_error_is_one_line_under_nproc(tmp_path):
    """The ranks find the bad model; rank 0 says so once and the launcher adds nothing."""
    proc = adalora("train", SMOKE, "model.name_or_path=tests/fixtures/no-such-model",
                   "--nproc", "2", "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["error: model folder tests/fixtures/no-such-model does not exist; set "
                     "model.name_or_path to a local model folder or a hub id"]
    assert not (tmp_path / "run").exists()


def test_more_processes_than_gpus_is_refused_before_any_launch(tmp_path, monkeypatch):
    """On CUDA each rank takes the GPU of its local rank; with one GPU visible, --nproc 2
    would crash rank 1 on CUDA's "invalid device ordinal". It is one line instead (the
    CUDA suite checks it on a real GPU: tests/cuda)."""
    from typer.testing import CliRunner

    from adalora_cli.cli import app
    from adalora_cli.engine import build, launch

    monkeypatch.setattr(build, "pick_device", lambda name, setting="": torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(launch, "launch", lambda *a: pytest.fail("launched"))
    result = CliRunner().invoke(app, ["train", SMOKE, "--nproc", "2", "--run-dir",
                                      str(tmp_path / "run")])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: --nproc 2 needs one GPU per process but 1 GPU is visible; use --nproc 1, "
        "or train.device=cpu for CPU processes")
    assert not (tmp_path / "run").exists()


@pytest.mark.e2e
def test_a_killed_rank_is_said_by_its_partner_and_the_launcher(tmp_path):
    """Rank 1 SIGKILLed after step 5: rank 0's next collective fails; it says a rank died
    (not gloo's socket error) and how to resume, and the launcher says which rank and how."""
    out, temp = tmp_path / "run", tmp_path / "tmp"
    temp.mkdir()
    proc = adalora("train", SMOKE, "--nproc", "2", "--run-dir", str(out), "--quiet",
                   env={"ADALORA_FAULT": "kill:1@step=5", "TMPDIR": str(temp)})
    assert proc.returncode == 128 + 9
    assert left_in(temp) == []  # read for the failure, then removed
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, proc.stderr + "|||" + proc.stdout
    said = lines[0].removeprefix("error: ")
    assert said.startswith("another process of this 2-process run died (Connection ")
    assert said.endswith(f"), so rank 0 stopped too; that process's own output (or the kernel "
                         "log, for the out-of-memory killer) says why; adalora train --resume "
                         f"{out} --nproc 2 continues the run (run directory marked failed: "
                         f"{out})")
    assert lines[1:] == ["error: rank 1 was killed by SIGKILL (as the out-of-memory killer "
                         "does)"]
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "failed" and status["error"].startswith("RankDied: another")


@pytest.mark.parametrize("ranks, says", [("2", "said it\n"), ("1", "")])
def test_a_failed_rank_says_its_error_through_the_launchers_sigterm(ranks, says):
    """The launcher SIGTERMs the ranks still alive as soon as it sees one die; a rank that
    failed (its collective lost the dead peer) must still get its one error line out, so
    the SIGTERM landing after the run failed is ignored, on a distributed rank only."""
    script = ("import os, signal, sys\n"
              "from adalora_cli.engine.signals import StopSignals\n"
              "try:\n"
              "    with StopSignals():\n"
              "        raise RuntimeError('Connection closed by peer')\n"
              "except RuntimeError:\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    sys.stdout.write('said it\\n')\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "WORLD_SIZE": ranks})
    assert proc.stdout == says
    assert proc.returncode == (0 if ranks == "2" else -signal.SIGTERM)


def test_only_a_lost_peer_of_a_distributed_run_is_a_dead_rank():
    from adalora_cli.engine.distributed import rank_died

    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                        "[127.0.0.1]:50388. This is typically caused by a remote worker")
    assert rank_died(gloo, World(0, 1, 0)) is None  # one process: nothing to lose
    assert rank_died(RuntimeError("shape mismatch"), World(0, 2, 0)) is None
    died = rank_died(gloo, World(1, 4, 1), "runs/x")
    assert str(died) == ("another process of this 4-process run died (Connection closed by "
                         "peer), so rank 1 stopped too; that process's own output (or the "
                         "kernel log, for the out-of-memory killer) says why; adalora train "
                         "--resume runs/x --nproc 4 continues the run")
