"""Several runs on one GPU (adalora_cli/sweep/packing.py): where each run goes by the memory
its config took before, with GPU sizes and peaks made up here (no GPU needed); and a local
sweep that starts, holds back and packs its runs by those numbers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from adalora_cli.sweep import local
from adalora_cli.sweep.packing import OVERHEAD, GpuPacker, need
from adalora_cli.sweep.plan import PlannedRun, SweepSpec
from adalora_cli.sweep.runs import Outcome
from tests.conftest import ROOT

GiB = 1 << 30
SMOKE = ROOT / "configs" / "smoke" / "glue.yaml"


def test_a_run_is_given_its_peak_a_fifth_more_and_a_gibibyte():
    assert OVERHEAD == GiB
    assert need(10 * GiB) == 13 * GiB  # 10 x 1.2 + 1
    assert need(5 * GiB, margin=0.5, overhead=0) == 7.5 * GiB


def test_measured_runs_fill_a_card_and_the_next_one_waits():
    packer = GpuPacker({"0": 80 * GiB})
    # 13 GiB each: 6 make 78 GiB, a seventh would need 91
    assert [packer.place(f"s{i}", 10 * GiB) for i in range(7)] == ["0"] * 6 + [None]
    assert packer.free("0") == 2 * GiB
    assert packer.where("s6") is None  # a waiting run holds nothing
    packer.release("s2")
    assert packer.place("s6", 10 * GiB) == "0"


def test_an_unmeasured_config_runs_alone_and_nothing_joins_it():
    packer = GpuPacker({"0": 80 * GiB, "1": 80 * GiB})
    assert packer.place("first", None) == "0"
    assert packer.free("0") == 0
    assert packer.place("small", 1 * GiB) == "1"  # not beside the unmeasured run
    assert packer.place("second-first", None) is None  # no empty GPU left
    packer.release("first")
    assert packer.place("second-first", None) == "0"


def test_the_fullest_gpu_that_fits_is_chosen_and_an_oversized_run_takes_an_empty_one():
    packer = GpuPacker({"a": 40 * GiB, "b": 40 * GiB, "c": 40 * GiB})
    assert packer.place("x", 20 * GiB) == "a"  # given 25 GiB: a has 15 left
    assert packer.place("y", 9 * GiB) == "a"  # given 11.8: beside x rather than on empty b
    assert packer.place("z", 12 * GiB) == "b"  # given 15.4: a has 3.2 left, b is empty
    assert packer.place("w", 1 * GiB) == "a"  # given 2.2: a (3.2 left) is fuller than b
    assert packer.place("huge", 100 * GiB) == "c"  # more than a GPU has: alone on an empty one
    assert packer.place("more", 1 * GiB) == "b"  # a has 1.0 left, c is full
    assert packer.place("huge2", 100 * GiB) is None  # no empty GPU: it waits


class _Proc:
    def __init__(self, polls: int):
        self.left = polls

    def poll(self):
        self.left -= 1
        return None if self.left > 0 else 0


class _FakeJob:
    """A run that ends after a few polls, leaving the summary a GPU run writes."""

    def __init__(self, run: PlannedRun, sweep_dir: Path, gpu: str, peak: int):
        self.run, self.gpu, self.peak = run, gpu, peak
        self.run_dir = sweep_dir / run.name
        self.proc = _Proc(3)

    def outcome(self) -> Outcome:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "summary.json").write_text(json.dumps(
            {"peak_memory_bytes": self.peak, "device": "cuda:0"}))
        return Outcome(self.run, "finished", 0.0)


def test_a_sweep_runs_each_configs_first_run_alone_then_packs_the_rest(tmp_path, monkeypatch):
    """One 40 GiB GPU, --jobs 4: the seeds of config a (10 GiB peak, given 13) go three at a
    time once the first has been measured; config b (another budget) first runs alone."""
    runs = [PlannedRun(f"a{s}", SMOKE, "adalora", None, s, (f"train.seed={s}",), "")
            for s in range(4)]
    runs.append(PlannedRun("b0", SMOKE, "adalora", None, 0,
                           ("adalora.budget=8", "train.seed=0"), ""))
    peaks = {"a": 10 * GiB, "b": 5 * GiB}
    running: list[_FakeJob] = []
    started: list[tuple[str, str, list[str]]] = []  # (run, gpu, runs beside it)

    def launch(run, sweep_dir, gpu, jobs, log):
        running[:] = [j for j in running if j.proc.left > 0]
        started.append((run.name, gpu, sorted(j.run.name for j in running)))
        job = _FakeJob(run, sweep_dir, gpu, peaks[run.name[0]])
        running.append(job)
        return job

    monkeypatch.setattr(local, "visible_gpus", lambda: ["0"])
    monkeypatch.setattr(local, "gpu_memory", lambda gpus: {"0": 40 * GiB})
    monkeypatch.setattr(local, "_launch", launch)
    monkeypatch.setattr(local.time, "sleep", lambda s: None)
    outcomes = local.execute(SweepSpec("t", [], Path("x")), runs, tmp_path, jobs=4,
                             quiet=True)
    assert [o.status for o in outcomes] == ["finished"] * 5
    assert started == [("a0", "0", []),  # alone: a has no record yet
                       ("a1", "0", []),  # after a0 ended and was measured
                       ("a2", "0", ["a1"]),
                       ("a3", "0", ["a1", "a2"]),  # 3 x 13 = 39 of 40 GiB
                       ("b0", "0", [])]  # b is unmeasured: it waited for an empty GPU


def test_a_second_sweep_reads_the_peaks_of_runs_finished_before(tmp_path, monkeypatch):
    runs = [PlannedRun(f"a{s}", SMOKE, "adalora", None, s, (f"train.seed={s}",), "")
            for s in range(3)]
    (tmp_path / "a0").mkdir()
    # a finished run from an earlier sweep, measured on a GPU
    (tmp_path / "a0" / "summary.json").write_text(json.dumps(
        {"peak_memory_bytes": 10 * GiB, "device": "cuda"}))
    monkeypatch.setattr(local, "_settled", lambda run, d, c: (
        Outcome(run, "skipped") if run.name == "a0" else None))
    concurrent: list[int] = []
    jobs: list[_FakeJob] = []

    def launch(run, sweep_dir, gpu, n, log):
        jobs.append(_FakeJob(run, sweep_dir, gpu, 10 * GiB))
        concurrent.append(sum(j.proc.left > 0 for j in jobs))
        return jobs[-1]

    monkeypatch.setattr(local, "visible_gpus", lambda: ["0"])
    monkeypatch.setattr(local, "gpu_memory", lambda gpus: {"0": 40 * GiB})
    monkeypatch.setattr(local, "_launch", launch)
    monkeypatch.setattr(local.time, "sleep", lambda s: None)
    local.execute(SweepSpec("t", [], Path("x")), runs, tmp_path, jobs=3, quiet=True)
    assert concurrent == [1, 2]  # a1 and a2 together at once: a's peak was known


@pytest.mark.parametrize("gpus, memory", [([], {"0": GiB}), (["0"], None)])
def test_no_packing_without_gpus_or_without_their_memory(gpus, memory, monkeypatch, capsys):
    monkeypatch.setattr(local, "gpu_memory", lambda g: memory)
    console = local.Console(stderr=True)
    assert local._packer(4, gpus, console) is None
    assert ("start without a memory check" in capsys.readouterr().err) == bool(gpus)
    assert local._packer(1, ["0"], console) is None  # one job at a time: nothing to pack


def test_gpu_memory_asks_nvidia_smi_for_each_gpu_in_turn(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\n# the last argument is the GPU id\n'
                   'for a; do id=$a; done\n'
                   'case $id in 0) echo 81000;; 3) echo " 40000";; *) echo "No devices"; '
                   'exit 6;; esac\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert local.gpu_memory(["3", "0"]) == {"3": 40000 << 20, "0": 81000 << 20}
    assert local.gpu_memory(["0", "7"]) is None  # one GPU it cannot read: no packing
    assert local.gpu_memory([]) is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert local.gpu_memory(["0"]) is None  # no nvidia-smi
