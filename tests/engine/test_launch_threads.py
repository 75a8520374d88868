"""``train --nproc N``: each rank gets cores / N threads unless the user set
OMP_NUM_THREADS, as ``sweep --jobs N`` gives each run; the launcher's own environment is
left as it was."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch.distributed.launcher.api as launcher_api

import adalora_cli
from adalora_cli.engine import launch as launch_module
from adalora_cli.rundir.owner import PARENT_ENV

pytestmark = pytest.mark.e2e  # starts rank processes

PROBE = {"torch": False}
"""When on, each stand-in rank is a real Python process reporting torch's thread count."""


@pytest.fixture()
def ranks(monkeypatch):
    """A stand-in for the elastic agent: what each rank would start with (the agent passes
    the launcher's environment on to every rank)."""
    seen: list[dict] = []
    monkeypatch.setitem(PROBE, "torch", False)

    def fake_elastic_launch(config, entrypoint):
        def start(*args):
            for _ in range(config.nproc_per_node):
                rank = {"args": args, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                        "parent": os.environ.get(PARENT_ENV)}
                if PROBE["torch"]:
                    rank["threads"] = int(subprocess.run(
                        [entrypoint, "-c", "import torch; print(torch.get_num_threads())"],
                        env=dict(os.environ), capture_output=True, text=True,
                        check=True).stdout)
                seen.append(rank)
        return start

    monkeypatch.setattr(launcher_api, "elastic_launch", fake_elastic_launch)
    return seen


def test_each_rank_gets_its_share_of_the_cores(ranks, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert launch_module.launch(2, ["train", "x.yaml"]) == 0
    assert [r["OMP_NUM_THREADS"] for r in ranks] == ["4", "4"]  # 8 cores / 2 ranks
    # `python -m adalora_cli train x.yaml`, with the launcher's adalora_cli
    # (test_launch_imports runs it)
    origin = os.path.abspath(adalora_cli.__file__)
    assert ranks[0]["args"] == ("-c", launch_module.RANK_MAIN, origin, "train", "x.yaml")
    assert "OMP_NUM_THREADS" not in os.environ  # the launcher's own setting is untouched
    # the ranks saw the launcher's pid (they die with it), but the launcher's own
    # environment keeps none: an in-process `train` after it would take the pid for its
    # parent's, find another parent, and SIGTERM itself
    assert [r["parent"] for r in ranks] == [str(os.getpid())] * 2
    assert PARENT_ENV not in os.environ


def test_two_ranks_on_two_cores_run_one_thread_each(ranks, monkeypatch):
    """What torch in a rank really runs (left alone, it takes every core: 2 per rank)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setitem(PROBE, "torch", True)
    launch_module.launch(2, ["train"])
    assert [r["threads"] for r in ranks] == [1, 1]


def test_more_ranks_than_cores_get_one_thread_each(ranks, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    launch_module.launch(16, ["train"])
    assert {r["OMP_NUM_THREADS"] for r in ranks} == {"1"}


def test_the_users_setting_wins(ranks, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    launch_module.launch(2, ["train"])
    assert [r["OMP_NUM_THREADS"] for r in ranks] == ["3", "3"]
    assert os.environ["OMP_NUM_THREADS"] == "3"


def test_the_real_launcher_module_is_what_we_patch():
    assert sys.modules["torch.distributed.launcher.api"] is launcher_api
