"""Thread defaults: OMP_WAIT_POLICY (from the load) and per-job thread counts fill in only
what the user left unset, in the CLI process (before torch loads) and in sweep workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from adalora_cli import threads
from adalora_cli.sweep.local import _child_env
from tests.conftest import ROOT


def test_the_policy_follows_the_load_and_user_settings_win():
    # other work holding half a core or more: threads sleep; under that they spin
    assert threads.child_defaults({}, load=0.5) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert threads.child_defaults({}, load=2.8) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert threads.child_defaults({}, load=0.49) == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert threads.child_defaults({}, load=0.0) == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert threads.child_defaults({"OMP_WAIT_POLICY": "ACTIVE"}, load=3.0) == {}
    assert threads.child_defaults({"OMP_WAIT_POLICY": "PASSIVE"}, load=0.0) == {}
    assert threads.child_defaults({"OMP_NUM_THREADS": "3"}, jobs=1, load=1.0) == {
        "OMP_WAIT_POLICY": "PASSIVE"}


def test_the_load_is_read_from_the_system_and_its_absence_is_passive(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 2.0, 2.0))  # the 1-minute figure
    assert threads.wait_policy() == "ACTIVE"
    monkeypatch.setattr(os, "getloadavg", lambda: (0.7, 0.0, 0.0))
    assert threads.wait_policy() == "PASSIVE"

    def no_load():
        raise OSError("load average unobtainable")

    monkeypatch.setattr(os, "getloadavg", no_load)
    assert threads.wait_policy() == "PASSIVE"
    monkeypatch.delattr(os, "getloadavg")  # as on Windows
    assert threads.wait_policy() == "PASSIVE"


def test_parallel_jobs_split_the_cores():
    assert threads.child_defaults({}, jobs=2, cpu_count=16)["OMP_NUM_THREADS"] == "8"
    assert threads.child_defaults({}, jobs=3, cpu_count=16)["OMP_NUM_THREADS"] == "5"
    assert threads.child_defaults({}, jobs=4, cpu_count=2)["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in threads.child_defaults({}, jobs=1, cpu_count=16)
    assert threads.child_defaults({"OMP_NUM_THREADS": "6"}, jobs=4, cpu_count=16,
                                  load=1.0) == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_apply_defaults_edits_only_the_given_environment():
    env = {"PATH": "/bin"}
    assert threads.apply_defaults(env, load=0.0) == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert env == {"PATH": "/bin", "OMP_WAIT_POLICY": "ACTIVE"}
    assert threads.apply_defaults(env, load=5.0) == {}  # decided once: a later load is not read


def test_sweep_workers_get_the_defaults(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.5, 1.5))
    env = _child_env(None, jobs=2)
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    env = _child_env("1", jobs=2)
    assert (env["OMP_WAIT_POLICY"], env["OMP_NUM_THREADS"]) == ("ACTIVE", "7")
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def cli_env_after(extra: dict[str, str], load: float) -> dict:
    """OMP_WAIT_POLICY as the CLI left it in its own process, on a machine whose 1-minute
    load average reads ``load``, and the exit code."""
    code = ("import json, os, sys\n"
            f"os.getloadavg = lambda: ({load!r}, 0.0, 0.0)\n"
            "from adalora_cli.cli import app\n"
            "sys.argv = ['adalora', 'train', 'no/such/config.yaml']\n"
            "try:\n    app()\nexcept SystemExit as e:\n    code = e.code\n"
            "print('ENV=' + json.dumps({'policy': os.environ.get('OMP_WAIT_POLICY'),"
            " 'code': code}))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120,
                          env={**env, **extra, "PYTHONPATH": str(ROOT)})
    line = next(x for x in done.stdout.splitlines() if x.startswith("ENV="))
    return json.loads(line[4:])


@pytest.mark.e2e
def test_cli_sets_the_policy_for_its_own_process():
    assert cli_env_after({}, load=0.0) == {"policy": "ACTIVE", "code": 2}
    assert cli_env_after({}, load=1.2) == {"policy": "PASSIVE", "code": 2}
    assert cli_env_after({"OMP_WAIT_POLICY": "ACTIVE"}, load=1.2)["policy"] == "ACTIVE"
    assert cli_env_after({"OMP_WAIT_POLICY": "PASSIVE"}, load=0.0)["policy"] == "PASSIVE"
