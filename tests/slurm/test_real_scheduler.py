"""``adalora sweep --launcher slurm`` against a real slurmctld, as a user runs it.

The cluster is the one ``make test-slurm`` starts (tests/slurm/cluster.sh: Debian's
slurm-wlm 22.05, nodes node1 and node2 on this host, no accounting, so sacct refuses). The
jobs run the smoke config on CPUs (``gpus_per_job=0``). What each test proves is in its
docstring; together: a job array capped by ``parallel``, ``--status`` while it runs and
``--wait``, a run failing inside its job, ``scontrol requeue`` of a running task, a time
limit reached, ``scancel``, a submitting sweep killed while its array runs, states from
squeue without accounting, and one run across the two nodes.
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.rundir.run import is_finished

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "configs" / "smoke" / "glue.yaml")
CPU_JOBS = "time=10,gpus_per_job=0"
NO_SACCT = "job states from: squeue (sacct refused: Slurm accounting storage is disabled)"
runner = CliRunner()


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """The test cluster, both nodes idle; every job the tests left is cancelled after."""
    if not os.environ.get("SLURM_CONF"):
        pytest.fail("no test cluster: run `make test-slurm`, or `tests/slurm/cluster.sh "
                    "start DIR` and the `export SLURM_CONF=...` it prints")
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True,
                           text=True, timeout=30).stdout.split("\n")
    assert sorted(n for n in nodes if n) == ["node1 idle", "node2 idle"], nodes
    cwd = os.getcwd()
    os.chdir(ROOT)  # configs name their fixtures relative to the repository, as a user's do
    yield
    os.chdir(cwd)
    subprocess.run(["scancel", "-u", getpass.getuser()], timeout=30)


def write_manifest(folder: Path, name: str, *groups: dict, seeds=(0,)) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "seeds": list(seeds), "runs": list(groups)}))
    return path


def sweep(manifest: Path, where: Path, *args: str) -> tuple[int, str]:
    """``adalora sweep MANIFEST --sweep-dir WHERE ARGS`` in this process: (exit code, stdout)."""
    result = runner.invoke(app, ["sweep", str(manifest), "--sweep-dir", str(where), *args],
                           env={"COLUMNS": "250"})
    return result.exit_code, result.stdout


def submit(manifest: Path, where: Path, slurm: str = CPU_JOBS) -> str:
    code, out = sweep(manifest, where, "--launcher", "slurm", "--slurm", slurm)
    assert code == 0, out
    return out


def sweep_process(manifest: Path, where: Path, slurm: str) -> subprocess.Popen:
    """``adalora sweep ... --launcher slurm --wait`` as its own process, as typed in a shell."""
    return subprocess.Popen([sys.executable, "-m", "adalora_cli", "sweep", str(manifest),
                             "--sweep-dir", str(where), "--launcher", "slurm", "--slurm", slurm,
                             "--wait"], cwd=ROOT, env={**os.environ, "COLUMNS": "250"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def table(out: str) -> dict[str, tuple[str, str]]:
    """{run: (state, detail)} from a status table."""
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines()
             if line.startswith("│ glue-")]
    return {c[0]: (c[1], c[3]) for c in cells}


def status(manifest: Path, where: Path) -> tuple[dict[str, tuple[str, str]], str]:
    code, out = sweep(manifest, where, "--status")
    assert code == 0, out
    return table(out), out


def events(where: Path, run: str | None = None) -> list[dict]:
    try:
        rows = [json.loads(line) for line in (where / "sweep_log.jsonl").read_text().splitlines()]
    except FileNotFoundError:
        return []
    return [r for r in rows if run is None or r["run"] == run]


def job_of(where: Path, run: str) -> str:
    return json.loads((where / "slurm_jobs.json").read_text())[run]["job_id"]


def squeue(job: str) -> list[list[str]]:
    """[task id, state, reason or nodes] of one job array's tasks the controller holds."""
    out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-j", job, "-o", "%i|%T|%R"],
                         capture_output=True, text=True, timeout=30).stdout
    return [line.split("|") for line in out.splitlines() if line]


def wait_for(condition, seconds: float, what: str, where: Path | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            logs = ""
            if where is not None and (where / "logs").is_dir():
                logs = "\n".join(f"{p.name}: {p.read_text()[-1500:]}"
                                 for p in (where / "logs").iterdir())
            queue = subprocess.run(["squeue", "-r"], capture_output=True, text=True).stdout
            pytest.fail(f"{what}: not within {seconds:.0f} s\nqueue:\n{queue}\n{logs}")
        time.sleep(1)


def job_ended(where: Path, run: Path) -> bool:
    """The run finished and its job said so (its last event), so the job is over."""
    said = events(where, run.name)
    return is_finished(run) and bool(said) and said[-1]["event"] == "finished"


def train_steps(run: Path) -> list[int]:
    return [row["step"] for row in map(json.loads, (run / "metrics.jsonl").read_text()
                                       .splitlines()) if "loss" in row]


def test_an_array_capped_by_parallel_with_status_while_it_runs_and_wait(tmp_path, capfd):
    """Three runs, at most two at once (``parallel=2``), one of which fails inside its job
    (its model folder is missing): the sweep, started with ``--wait``, returns once every
    task has left the queue; ``--status`` while it runs shows them running and queued; the
    states come from squeue with one line saying why (sacct refuses without accounting),
    never submitit's "Bypassing sacct error" warnings; the failure's own error is in
    ``--status`` and the other two runs finished."""
    manifest = write_manifest(
        tmp_path, "array", {"configs": [SMOKE], "methods": ["lora"],
                            "overrides": ["train.epochs=2"]},
        {"configs": [SMOKE], "methods": ["adalora"],
         "overrides": ["model.name_or_path=tests/fixtures/no-such-model"]}, seeds=(0, 1))
    where = tmp_path / "array"
    proc = sweep_process(manifest, where, f"{CPU_JOBS},parallel=2")
    wait_for(lambda: (where / "slurm_jobs.json").is_file() or proc.poll() is not None, 180,
             "the sweep submitted its array")
    array = job_of(where, "glue-lora-s0").split("_")[0]
    seen, during = [], None
    while proc.poll() is None:
        tasks = squeue(array)
        seen.append(tasks)
        if during is None and any(t[1] == "RUNNING" for t in tasks):
            during = status(manifest, where)
        time.sleep(1)
    out = proc.stdout.read()
    assert proc.returncode == 1, out  # a run failed
    running = [sum(t[1] == "RUNNING" for t in tasks) for tasks in seen]
    assert max(running) == 2, seen  # two at once, never three
    assert any(t[2] == "(JobArrayTaskLimit)" for tasks in seen for t in tasks), seen
    assert during is not None, seen
    rows, text = during
    assert len(rows) == 4 and {"running"} <= {s for s, _ in rows.values()} <= {
        "running", "queued", "finished", "failed"}, text
    assert NO_SACCT in text
    final = table(out)
    assert {run: state for run, (state, _) in final.items()} == {
        "glue-lora-s0": "finished", "glue-lora-s1": "finished",
        "glue-adalora-s0": "failed", "glue-adalora-s1": "failed"}, out
    assert out.count(NO_SACCT) == 1 and "Bypassing" not in out
    rows, text = status(manifest, where)
    assert rows["glue-adalora-s0"][0] == "failed"
    assert rows["glue-adalora-s0"][1].startswith(
        "exit 2: error: model folder tests/fixtures/no-such-model"), text
    for run in ("glue-lora-s0", "glue-lora-s1"):
        assert is_finished(where / run) and train_steps(where / run) == list(range(1, 17))
    captured = capfd.readouterr()
    assert "Bypassing" not in captured.out + captured.err
    assert "accounting storage is disabled" not in captured.err  # sacct's own stderr


def test_scontrol_requeue_checkpoints_and_resumes_to_the_uninterrupted_run(tmp_path,
                                                                          smoke_runs):
    """Preemption as a cluster does it: ``scontrol requeue`` of the running task. SLURM
    stops the job (SIGTERM to its processes), the run checkpoints at its next step and
    ends preempted, SLURM requeues the job (it was submitted with --requeue) and the new
    attempt resumes: every step logged once, the same final weights as an uninterrupted
    run of the same config."""
    manifest = write_manifest(tmp_path, "requeue", {"configs": [SMOKE], "methods": ["lora"],
                                                    "overrides": ["train.epochs=40"]})
    where = tmp_path / "requeue"
    submit(manifest, where)
    run = where / "glue-lora-s0"
    wait_for(lambda: (run / "metrics.jsonl").is_file() and len(train_steps(run)) >= 40, 300,
             "the run trained 40 steps", where)
    subprocess.run(["scontrol", "requeue", job_of(where, run.name)], check=True, timeout=30)
    wait_for(lambda: job_ended(where, run), 400, "the requeued run finished", where)
    kinds = [e["event"] for e in events(where, run.name)]
    assert sorted(kinds[:2]) == ["started", "submitted"] and kinds[2:] == [
        "preempted", "resumed", "finished"], kinds
    summary = json.loads((run / "summary.json").read_text())
    assert summary["attempts"] == 2 and summary["total_steps"] == 320
    assert train_steps(run) == list(range(1, 321))
    commands = [line for line in (where / "logs" / f"{run.name}.log").read_text().splitlines()
                if line.startswith("$ ")]
    assert len(commands) == 2 and "--resume" in commands[1]
    planned = yaml.safe_load((where / "sweep.yaml").read_text())["runs"][0]["overrides"]
    straight = smoke_runs(SMOKE, *planned)  # the same command, uninterrupted
    assert (run / "adapter_model.safetensors").read_bytes() == (
        straight / "adapter_model.safetensors").read_bytes()
    losses = [[r["loss"] for r in map(json.loads, (p / "metrics.jsonl").read_text()
                                      .splitlines()) if "loss" in r] for p in (run, straight)]
    assert losses[0] == losses[1]


def test_a_time_limit_checkpoints_requeues_and_finishes_within_requeues(tmp_path):
    """A time limit reached mid-run: once the run trains, its job's limit is cut to the
    next minute but one (``scontrol update TimeLimit``, so the limit comes at a known
    point of the run whatever this machine's speed), which puts the job inside its
    ``--signal=USR2@120`` window: SLURM's timer sends USR2 at its next check (every 30 s),
    at least 30 s before the limit; submitit's checkpoint hook stops the run with a
    checkpoint and requeues the job, counted as a time-out against ``requeues``. The
    limit given back to the waiting job, the resumed attempt finishes: every step once."""
    manifest = write_manifest(tmp_path, "limit", {"configs": [SMOKE], "methods": ["lora"],
                                                  "overrides": ["train.epochs=300"]})
    where = tmp_path / "limit"
    submit(manifest, where, f"{CPU_JOBS},requeues=1")
    run = where / "glue-lora-s0"
    job = job_of(where, run.name)
    wait_for(lambda: (run / "metrics.jsonl").is_file() and len(train_steps(run)) >= 40, 300,
             "the run trained 40 steps", where)
    elapsed = subprocess.run(["squeue", "-h", "-j", job, "-o", "%M"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    minutes = sum(int(x) * 60 ** i for i, x in enumerate(reversed(elapsed.split(":")))) / 60
    subprocess.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={int(minutes) + 2}"],
                   check=True, timeout=30)
    wait_for(lambda: any(e["event"] == "requeued" for e in events(where, run.name)), 120,
             "the job was signalled and requeued before its limit", where)
    subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=10"], check=True,
                   timeout=30)
    wait_for(lambda: job_ended(where, run), 600, "the requeued run finished", where)
    kinds = [e["event"] for e in events(where, run.name)]
    assert sorted(kinds[:2]) == ["started", "submitted"] and kinds[2:] == [
        "requeued", "resumed", "finished"], kinds
    assert events(where, run.name)[2]["exit"] == 75  # stopped with a checkpoint
    summary = json.loads((run / "summary.json").read_text())
    assert summary["attempts"] == 2 and train_steps(run) == list(range(1, 2401))
    job_logs = "".join(p.read_text() for p in (where / "slurm").glob("*_log.*"))
    assert "Caught signal SIGUSR2" in job_logs and "this job is timed-out" in job_logs
    assert "1 remaining timeouts" not in job_logs and "0 remaining timeouts" in job_logs


def test_scancel_and_a_killed_sweep_lose_nothing(tmp_path):
    """A sweep started with ``--wait`` is killed while its array runs (one task at a time);
    then ``scancel`` ends the running task and one still waiting. ``--status`` shows the
    running one cancelled, at the checkpoint it wrote on SLURM's SIGTERM; the waiting one
    left no trace (without accounting SLURM forgets a cancelled array task that never
    started) and shows as not started. Running the sweep again submits exactly those two,
    not the one still queued or running; all three finish, the cancelled one resumed."""
    manifest = write_manifest(
        tmp_path, "cancel", {"configs": [SMOKE], "methods": ["lora"],
                             "overrides": ["train.epochs=100"], "seeds": [0]},
        {"configs": [SMOKE], "methods": ["lora"], "overrides": ["train.epochs=2"],
         "seeds": [1, 2]})
    where = tmp_path / "cancel"
    proc = sweep_process(manifest, where, f"{CPU_JOBS},parallel=1")
    first = where / "glue-lora-s0"
    wait_for(lambda: (first / "metrics.jsonl").is_file() and len(train_steps(first)) >= 20,
             300, "the first task trained 20 steps", where)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    jobs = {run: job_of(where, run) for run in ("glue-lora-s0", "glue-lora-s2")}
    subprocess.run(["scancel", *jobs.values()], check=True, timeout=30)
    wait_for(lambda: any(e["event"] == "preempted" for e in events(where, first.name)), 60,
             "the cancelled run stopped with a checkpoint", where)
    # its job is 'running' until SLURM has ended every process of it (KillWait)
    wait_for(lambda: status(manifest, where)[0]["glue-lora-s0"][0] != "running", 60,
             "the cancelled job left the queue", where)
    rows, text = status(manifest, where)
    assert rows["glue-lora-s0"][0] == "cancelled", text
    assert rows["glue-lora-s0"][1].startswith("job cancelled; checkpoint at step "), text
    assert rows["glue-lora-s2"][0] == "not started", text
    assert rows["glue-lora-s1"][0] in ("queued", "running", "finished"), text
    assert NO_SACCT in text
    out = submit(manifest, where)
    submitted = [e["run"] for e in events(where) if e["event"] == "submitted"]
    assert sorted(submitted) == ["glue-lora-s0", "glue-lora-s0", "glue-lora-s1",
                                 "glue-lora-s2", "glue-lora-s2"], out
    runs = [where / f"glue-lora-s{seed}" for seed in range(3)]
    wait_for(lambda: all(job_ended(where, r) for r in runs), 400, "every run finished", where)
    assert [e["event"] for e in events(where, first.name)][-2:] == ["resumed", "finished"]
    assert train_steps(first) == list(range(1, 801))
    for run in runs[1:]:
        assert train_steps(run) == list(range(1, 17))
        assert [e["event"] for e in events(where, run.name)].count("started") == 1


def test_one_run_across_two_nodes(tmp_path):
    """``--slurm nodes=2``: the sbatch script asks for two nodes, one task each; each task
    starts a torchrun agent with the same command, meeting at the first node's c10d
    rendezvous, and the two ranks train one sharded run (train.sharding=fsdp) to its end."""
    short = ["train.max_steps=12", "adalora.t_init=2", "adalora.delta_t=2",
             "adalora.t_final=3", "train.sharding=fsdp"]
    manifest = write_manifest(tmp_path, "nodes", {"configs": [SMOKE], "methods": ["adalora"],
                                                  "overrides": short})
    where = tmp_path / "nodes"
    submit(manifest, where, f"{CPU_JOBS},nodes=2")
    run = where / "glue-adalora-s0"
    job = job_of(where, run.name)
    placed: list[str] = []

    def done() -> bool:
        placed.extend(t[2] for t in squeue(job) if t[1] == "RUNNING")
        return job_ended(where, run)

    wait_for(done, 400, "the two-node run finished", where)
    assert "node[1-2]" in placed  # one job on both nodes
    commands = [line for line in (where / "logs" / f"{run.name}.log").read_text().splitlines()
                if line.startswith("$ ")]
    assert len(commands) == 2 and commands[0] == commands[1]  # one agent a node, same command
    assert "--nnodes=2" in commands[0] and "--rdzv_endpoint=127.0.0.1:" in commands[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["total_steps"] == 12 and summary["final_budget"] == 16
    assert train_steps(run) == list(range(1, 13))
    assert [e["event"] for e in events(where, run.name)][-1] == "finished"
