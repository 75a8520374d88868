"""Run ownership: a dead run is never taken for a live one, and only one process claims it."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from adalora_cli.config import ConfigError, RunConfig
from adalora_cli.errors import RunBusy
from adalora_cli.rundir import owner as lifecycle
from adalora_cli.rundir.run import RunDir
from adalora_cli.rundir.summary import Summary


def write_status(path, **fields):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text("{}\n")
    (path / "status.json").write_text(json.dumps({"status": "running", **fields}))


def test_our_own_process_is_alive(tmp_path):
    write_status(tmp_path / "r", **lifecycle.identity())
    alive, why = lifecycle.owner_alive(tmp_path / "r")
    assert alive and why == f"process {os.getpid()} on this host"


def test_a_reused_pid_is_not_the_owner(tmp_path):
    me = lifecycle.identity()
    write_status(tmp_path / "r", **{**me, "pid_start": me["pid_start"] - 1})
    alive, why = lifecycle.owner_alive(tmp_path / "r")
    assert not alive and "belongs to another process" in why


def test_a_gone_pid_or_a_reboot_is_dead(tmp_path):
    write_status(tmp_path / "a", **{**lifecycle.identity(), "pid": 2**22 + 12345})
    assert lifecycle.owner_alive(tmp_path / "a") == (False, f"process {2**22 + 12345} is gone")
    write_status(tmp_path / "b", **{**lifecycle.identity(), "boot_id": "another-boot"})
    assert lifecycle.owner_alive(tmp_path / "b")[0] is False


def test_another_host_is_judged_by_its_heartbeat(tmp_path, monkeypatch):
    monkeypatch.setenv("ADALORA_HEARTBEAT_SECONDS", "2")  # stale after 20 s
    run = tmp_path / "r"
    write_status(run, host="node-17", pid=4242, pid_start=1, boot_id="x")
    claimed = time.time() - 600
    os.utime(run / "status.json", (claimed, claimed))  # claimed long ago
    (run / "heartbeat.json").write_text(json.dumps({"time": time.time() - 5, "step": 9}))
    alive, why = lifecycle.owner_alive(run)
    assert alive and why.startswith("process 4242 on node-17 (heartbeat 5 s ago")
    (run / "heartbeat.json").write_text(json.dumps({"time": time.time() - 60, "step": 9}))
    alive, why = lifecycle.owner_alive(run)
    assert not alive and why == "no heartbeat from node-17 for 60 s"


def test_heartbeat_thread_rewrites_step_and_time(tmp_path, monkeypatch):
    monkeypatch.setenv("ADALORA_HEARTBEAT_SECONDS", "0.05")
    with lifecycle.Heartbeat(tmp_path) as beat:
        beat.step = 7
        time.sleep(0.3)
        row = lifecycle.read_heartbeat(tmp_path)
    assert row["step"] == 7 and row["pid"] == os.getpid()
    assert row["host"] == socket.gethostname() and time.time() - row["time"] < 1


@pytest.mark.e2e
def test_exactly_one_of_many_processes_claims_a_new_run(tmp_path):
    """Eight forked processes race to create the same run directory."""
    target, n = tmp_path / "r", 8
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                RunDir.create(target, RunConfig())
                time.sleep(1)  # stay alive, so the others see a live owner
                code = 0
            except RunBusy:
                code = 1
            except ConfigError:
                code = 2
            finally:
                os._exit(code)
        pids.append(pid)
    codes = sorted(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids)
    assert codes == [0] + [1] * (n - 1)


def test_resume_claims_are_exclusive_and_refuse_finished_runs(tmp_path):
    run = RunDir.create(tmp_path / "r", RunConfig())
    with pytest.raises(RunBusy):
        RunDir.reopen(run.path)  # we are its live owner
    run.preempt("stopped by SIGTERM", step=3)
    again = RunDir.reopen(run.path)
    status = RunDir.read_status(run.path)
    assert status["status"] == "running" and status["attempt"] == 2
    again.finish(Summary(task="rte", method="lora"))
    with pytest.raises(ConfigError, match="is finished; nothing to resume"):
        RunDir.reopen(run.path)


def test_status_survives_a_full_disk(tmp_path, monkeypatch):
    """With no room for a temporary copy, the short failed status overwrites in place."""
    import errno
    from pathlib import Path

    run = RunDir.create(tmp_path / "r", RunConfig())
    real = Path.write_text

    def full(self, *args, **kwargs):
        if self.name.endswith(".tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    run.fail("OSError: [Errno 28] No space left on device")
    monkeypatch.undo()
    status = RunDir.read_status(run.path)
    assert status["status"] == "failed" and "No space left" in status["error"]


def test_metrics_stay_strict_json(tmp_path):
    run = RunDir.create(tmp_path / "r", RunConfig())
    run.log({"step": 1, "split": "validation", "pearson": float("nan"), "x": float("inf")})
    run.close()
    line = (run.path / "metrics.jsonl").read_text().strip()

    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    assert json.loads(line, parse_constant=refuse) == {
        "step": 1, "split": "validation", "pearson": None, "x": None}


def test_a_resumed_runs_old_heartbeat_does_not_make_it_look_dead(tmp_path, monkeypatch):
    """Seen from another host, the claim (status.json) is fresher than the last attempt's
    heartbeat: the new owner is alive from the moment it claims the run."""
    monkeypatch.setenv("ADALORA_HEARTBEAT_SECONDS", "2")
    run = tmp_path / "r"
    write_status(run, host="node-17", pid=4242, pid_start=1, boot_id="x")
    (run / "heartbeat.json").write_text(json.dumps({"time": time.time() - 3600, "step": 9}))
    alive, why = lifecycle.owner_alive(run)
    assert alive and why.startswith("process 4242 on node-17 (heartbeat 0 s ago")
