"""Sweeps through submitit: the --slurm options, the sbatch script they make, and the real
submitit code path run by its local executor (no SLURM needed): a sweep completes, a
failing run is reported while the rest go on, a job signalled mid-run is requeued and
resumes from its checkpoint, and a re-run submits only what is missing."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import submitit
import yaml
from typer.testing import CliRunner

import adalora_cli
from adalora_cli.cli import app
from adalora_cli.config import ConfigError
from adalora_cli.rundir.run import RunDir, is_finished
from adalora_cli.sweep.plan import PlannedRun, build_spec, plan
from adalora_cli.sweep.slurm import SlurmLauncher, make_executor
from adalora_cli.sweep.slurm_job import train_command
from adalora_cli.sweep.slurm_options import parse_slurm, parse_time
from adalora_cli.sweep.status import RunStatus, _combine, sweep_states

ROOT = Path(__file__).resolve().parents[2]
SMOKE = "configs/smoke/glue.yaml"
runner = CliRunner()


# --------------------------------------------------------------------------- options


@pytest.mark.parametrize("text, minutes", [
    ("90", 90), ("24:00:00", 1440), ("1:30", 2), ("2-00", 2880), ("1-12:30", 2190),
    ("0-00:00:30", 1), ("3-04:05:06", 3 * 1440 + 4 * 60 + 6),
])
def test_slurm_time_formats(text, minutes):
    assert parse_time(text) == minutes  # whole minutes, seconds rounded up


def test_parse_slurm_keys_and_commas_inside_values():
    opts = parse_slurm(["partition=gpu,time=24:00:00,gpus_per_job=2",
                        "mem=64g,sbatch.exclude=node1,node2,qos=high,sbatch.exclusive="])
    assert (opts.partition, opts.time_min, opts.gpus_per_job) == ("gpu", 1440, 2)
    assert (opts.mem, opts.qos) == ("64G", "high")
    assert opts.sbatch == {"exclude": "node1,node2", "exclusive": True}
    assert (opts.signal_delay, opts.requeues, opts.cpus) == (120, 3, None)  # defaults


@pytest.mark.parametrize("items, fragment", [
    (["time=1:00:00,gpus=2"], "unknown key 'gpus'; valid keys: partition, time"),
    (["partition=gpu"], "add --slurm time=HH:MM:SS"),
    (["time=soon"], "time=soon: not a SLURM time"),
    (["time=0"], "must be positive"),
    (["time=60,mem=1.5G"], "mem=1.5G: not a memory size"),
    (["time=60,cpus=0"], "cpus=0: must be an integer >= 1"),
    (["partition", "time=60"], "'partition' is not key=value"),
    (["time=60,partition="], "partition= needs a value"),
])
def test_parse_slurm_refuses_bad_items(items, fragment):
    with pytest.raises(ConfigError) as e:
        parse_slurm(items)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_sbatch_script_of_a_job_array(tmp_path, monkeypatch):
    """The exact #SBATCH lines submitit writes for our options (no sbatch is called)."""
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    opts = parse_slurm(["partition=gpu,time=1-12:00:00,gpus_per_job=4,cpus=16,mem=64G",
                        "account=proj,qos=high,constraint=a100|h100,parallel=2",
                        "sbatch.mail-type=END,sbatch.exclusive="])
    executor = make_executor(tmp_path, opts, "adalora-table1")
    executor.parameters["map_count"] = 3  # what submitit sets for an array of 3 runs
    text = executor._make_submission_file_text("python -m submitit.core._submit X", "u")
    flags = sorted(line for line in text.splitlines() if line.startswith("#SBATCH"))
    assert flags == sorted([
        "#SBATCH --account=proj",
        "#SBATCH --array=0-2%2",
        "#SBATCH --constraint='a100|h100'",
        "#SBATCH --cpus-per-task=16",
        f"#SBATCH --error={tmp_path}/%A_%a_0_log.err",
        "#SBATCH --exclusive",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --job-name=adalora-table1",
        "#SBATCH --mail-type=END",
        "#SBATCH --mem=64G",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={tmp_path}/%A_%a_0_log.out",
        "#SBATCH --partition=gpu",
        "#SBATCH --qos=high",
        "#SBATCH --requeue",
        "#SBATCH --signal=USR2@120",
        "#SBATCH --time=2160",
        "#SBATCH --wckey=submitit",
    ])


def test_a_multi_gpu_job_is_one_torchrun(tmp_path):
    run = PlannedRun("r", Path(SMOKE), "lora", None, 0, ("method.name=lora",), "")
    cmd = train_command(run, tmp_path / "r", resume=False, nproc=4)
    assert cmd[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                        "--no-python"]
    # each rank: this interpreter running this adalora_cli (tests/sweep/test_child_imports.py)
    assert cmd[6:8] == [sys.executable, "-c"]
    assert cmd[9:] == [os.path.abspath(adalora_cli.__file__), "train", SMOKE,
                       "method.name=lora", "--run-dir", str(tmp_path / "r")]
    assert train_command(run, tmp_path / "r", resume=True)[3:] == [
        os.path.abspath(adalora_cli.__file__), "train", "--resume", str(tmp_path / "r")]


@pytest.mark.parametrize("args, fragment", [
    (["--launcher", "slurm"], "add --slurm time=HH:MM:SS"),
    (["--launcher", "slurm", "--slurm", "time=60,gpu=1"], "unknown key 'gpu'"),
    (["--launcher", "slurm", "--slurm", "time=60", "--jobs", "4"], "--slurm parallel=N"),
    (["--slurm", "time=60"], "add --launcher slurm"),
    (["--launcher", "pbs"], "unknown --launcher 'pbs'"),
    (["--wait"], "--wait is for --launcher slurm"),
    (["--launcher", "slurm", "--slurm", "time=60"], "no SLURM here (srun not found)"),
])
def test_bad_launcher_input_one_line(args, fragment, in_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))  # no srun on this PATH
    result = runner.invoke(app, ["sweep", SMOKE, *args, "--sweep-dir", str(tmp_path / "s")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0]
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("directory, event, sched, expected", [
    (("not started", ""), None, "PENDING", ("queued", "job pending")),
    (("preempted", "checkpoint at step 40"), None, "REQUEUED", ("queued", "job requeued")),
    (("not started", ""), None, "RUNNING", ("running", "job started")),
    (("running", "step 7"), None, "RUNNING", ("running", "step 7")),
    (("finished", ""), None, "PENDING", ("finished", "")),  # the run directory wins
    (("not started", ""), None, "CANCELLED",
     ("cancelled", "job cancelled before the run started")),
    (("preempted", "checkpoint at step 40"), None, "CANCELLED",
     ("cancelled", "job cancelled; checkpoint at step 40")),
    (("not started", ""), None, "OUT_OF_MEMORY",
     ("failed", "job out_of_memory before the run started")),
    (("not started", ""), None, "COMPLETED", ("not started", "")),  # e.g. it found it busy
    (("not started", ""), {"event": "failed", "error": "exit 2: error: x"}, "RUNNING",
     ("failed", "exit 2: error: x")),
    (("preempted", "checkpoint at step 40"), None, "", ("preempted", "checkpoint at step 40")),
])
def test_run_state_from_directory_log_and_scheduler(directory, event, sched, expected):
    assert _combine("r", directory, event, sched, "77_1") == RunStatus("r", *expected, "77_1")


# --------------------------------------------------------------------------- local executor

LOCAL = parse_slurm(["time=10,gpus_per_job=0"])  # CPU jobs; the signal comes 2 min early


def events(where: Path) -> list[dict]:
    return [json.loads(line) for line in (where / "sweep_log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    """Three runs: LoRA and BitFit for one epoch, and an AdaLoRA run whose model folder is
    missing, which `adalora train` refuses (exit 2) after the plan has accepted it."""
    path = tmp_path_factory.mktemp("manifest") / "mixed.yaml"
    path.write_text(yaml.safe_dump({"name": "mixed", "runs": [
        {"configs": [str(ROOT / SMOKE)], "methods": ["lora", "bitfit"],
         "overrides": ["train.epochs=1"]},
        {"configs": [str(ROOT / SMOKE)], "methods": ["adalora"],
         "overrides": ["model.name_or_path=tests/fixtures/no-such-model"]}]}))
    return path


@pytest.fixture(scope="module")
def local_sweep(manifest, tmp_path_factory):
    os.chdir(ROOT)
    where = tmp_path_factory.mktemp("slurm") / "mixed"
    spec = build_spec(manifest)
    runs = plan(spec)
    launcher = SlurmLauncher(LOCAL, cluster="local", wait=True, poll_seconds=0.5)
    outcomes = launcher.launch(spec, runs, where)
    return where, spec, runs, outcomes


@pytest.mark.e2e
def test_a_sweep_completes_and_a_failing_run_is_reported(local_sweep):
    where, _, _, outcomes = local_sweep
    states = {o.run.name: o.status for o in outcomes}
    assert states == {"glue-lora-s0": "finished", "glue-bitfit-s0": "finished",
                      "glue-adalora-s0": "failed"}
    failed = next(o for o in outcomes if o.status == "failed")
    assert failed.error.startswith("exit 2: error: model folder tests/fixtures/no-such-model")
    for name in ("glue-lora-s0", "glue-bitfit-s0"):
        assert is_finished(where / name)
        assert json.loads((where / name / "summary.json").read_text())["total_steps"] == 8
    # one submitit job per run, its ids recorded; submitit's own files in slurm/
    records = json.loads((where / "slurm_jobs.json").read_text())
    assert sorted(records) == sorted(states) and {r["cluster"] for r in records.values()} == {
        "local"}
    for record in records.values():
        assert (where / "slurm" / f"{record['job_id']}_submitted.pkl").is_file()
    kinds = [(e["run"], e["event"]) for e in events(where)]
    for name, final in states.items():  # a job may start before its submission is logged
        mine = [k for r, k in kinds if r == name]
        assert sorted(mine[:2]) == ["started", "submitted"] and mine[2:] == [final]


@pytest.mark.e2e
def test_status_lists_every_run_and_submits_nothing(local_sweep, manifest):
    where = local_sweep[0]
    before = (where / "sweep_log.jsonl").read_text()
    result = runner.invoke(app, ["sweep", str(manifest), "--sweep-dir", str(where),
                                 "--status"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
            for line in result.stdout.splitlines() if line.startswith("│ glue-")}
    assert rows == {"glue-lora-s0": "finished", "glue-bitfit-s0": "finished",
                    "glue-adalora-s0": "failed"}
    assert "3 runs: 2 finished, 1 failed" in result.stdout
    assert (where / "sweep_log.jsonl").read_text() == before  # nothing was submitted


@pytest.mark.e2e
def test_rerun_submits_only_what_is_missing(local_sweep):
    where, spec, runs, _ = local_sweep
    launcher = SlurmLauncher(LOCAL, cluster="local", wait=False)
    outcomes = launcher.launch(spec, runs, where)
    statuses = {o.run.name: o.status for o in outcomes}
    assert statuses == {"glue-lora-s0": "finished", "glue-bitfit-s0": "finished",
                        "glue-adalora-s0": "submitted"}
    submitted = [e["run"] for e in events(where) if e["event"] == "submitted"]
    assert submitted.count("glue-adalora-s0") == 2 and submitted.count("glue-lora-s0") == 1
    deadline = time.time() + 120
    while time.time() < deadline:  # the resubmitted run fails again, on its own
        state = sweep_states(runs, where)[2]
        if state.state == "failed":
            break
        assert state.state in ("running", "failed", "not started")
        time.sleep(0.5)
    assert state.state == "failed" and "no-such-model" in state.detail


@pytest.mark.e2e
def test_a_signalled_job_is_requeued_and_resumes(tmp_path, in_repo):
    """SIGUSR2 to the job process, as SLURM sends it before a time limit or preemption:
    submitit's checkpoint hook stops the training process with a checkpoint, the job is
    requeued, and the new attempt resumes it to the end."""
    spec = build_spec(Path(SMOKE), methods="lora", overrides=["train.epochs=40"])
    runs = plan(spec)
    where = tmp_path / "requeue"
    run = where / runs[0].name
    SlurmLauncher(LOCAL, cluster="local").launch(spec, runs, where)
    deadline = time.time() + 180
    while not (run / "metrics.jsonl").exists() and time.time() < deadline:
        time.sleep(0.1)  # the run is training
    child = RunDir.read_status(run)["pid"]
    job_process = int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(job_process, signal.SIGUSR2)
    deadline = time.time() + 240
    while events(where)[-1]["event"] != "finished" and time.time() < deadline:
        time.sleep(0.5)  # the job ends after its run
    assert is_finished(run), (where / "logs" / f"{run.name}.log").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["attempts"] == 2 and summary["total_steps"] == 320
    kinds = [e["event"] for e in events(where)]
    assert sorted(kinds[:2]) == ["started", "submitted"]
    assert kinds[2:] == ["requeued", "resumed", "finished"]
    requeued = next(e for e in events(where) if e["event"] == "requeued")
    assert requeued["exit"] == 75  # it stopped with a checkpoint, as preempted
    commands = [line for line in (where / "logs" / f"{run.name}.log").read_text().splitlines()
                if line.startswith("$ ")]
    assert len(commands) == 2 and "--resume" in commands[1] and "--resume" not in commands[0]
    # the resumed attempt continued from the checkpoint: every step logged exactly once
    steps = [row["step"] for row in map(json.loads, (run / "metrics.jsonl").read_text()
                                        .splitlines()) if "split" not in row]
    assert steps == list(range(1, 321))


def test_job_function_pickles_without_its_process(tmp_path):
    """submitit pickles the job again at checkpoint time; a live child must not go along."""
    import pickle

    from adalora_cli.sweep.slurm_job import TrainJob

    job = TrainJob(PlannedRun("r", Path(SMOKE), "lora", None, 0, (), ""), tmp_path)
    job._proc = object()
    copy = pickle.loads(pickle.dumps(job))
    assert copy._proc is None and copy.run_dir == (tmp_path / "r").resolve()
    assert copy.cwd == Path.cwd()  # relative config and model paths resolve as submitted


def test_only_a_single_process_run_watches_its_job(tmp_path):
    """ADALORA_PARENT_PID makes `adalora train` stop when that pid is not its parent; under
    torchrun the ranks' parent is torchrun, so the job must not set it there."""
    from adalora_cli.rundir.owner import PARENT_ENV
    from adalora_cli.sweep.slurm_job import TrainJob

    run = PlannedRun("r", Path(SMOKE), "lora", None, 0, (), "")
    assert TrainJob(run, tmp_path, nproc=1).env()[PARENT_ENV] == str(os.getpid())
    assert PARENT_ENV not in TrainJob(run, tmp_path, nproc=2).env()


# --------------------------------------------------------------------------- two nodes


def test_sbatch_script_of_a_two_node_run(tmp_path, monkeypatch):
    """--slurm nodes=2: one task a node, each started by the script's srun line; checked on
    a real scheduler by tests/slurm/test_real_scheduler.py."""
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    opts = parse_slurm(["time=60,nodes=2,gpus_per_job=4"])
    assert SlurmLauncher(opts).processes_per_run == 8  # a sharded run is allowed
    executor = make_executor(tmp_path, opts, "adalora-x")
    executor.parameters["map_count"] = 1
    lines = executor._make_submission_file_text("python -m submitit.core._submit X",
                                                "u").splitlines()
    flags = [line for line in lines if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=2" in flags and "#SBATCH --ntasks-per-node=1" in flags
    assert "#SBATCH --gpus-per-node=4" in flags
    srun = [line for line in lines if line.startswith("srun")]
    assert len(srun) == 1 and srun[0].endswith("python -m submitit.core._submit X")
    assert "--ntasks" not in srun[0]  # one task on each of the job's nodes


def test_each_node_runs_one_torchrun_agent_at_the_first_nodes_rendezvous(tmp_path):
    from adalora_cli.sweep.slurm_job import RDZV_PORTS, Nodes

    env = {"SLURM_JOB_ID": "4242", "SLURM_LAUNCH_NODE_IPADDR": "10.1.2.3",
           "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    nodes = Nodes.of_this_job(2, env)
    port = RDZV_PORTS[0] + 4242 % (RDZV_PORTS[1] - RDZV_PORTS[0])
    assert nodes == Nodes(2, f"10.1.2.3:{port}", "4242.1")
    run = PlannedRun("r", Path(SMOKE), "lora", None, 0, ("method.name=lora",), "")
    cmd = train_command(run, tmp_path / "r", resume=False, nproc=4, nodes=nodes)
    assert cmd[1:10] == ["-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=4",
                         "--rdzv_backend=c10d", f"--rdzv_endpoint=10.1.2.3:{port}",
                         "--rdzv_id=4242.1", "--no-python", sys.executable]
    assert cmd[-5:] == ["train", SMOKE, "method.name=lora", "--run-dir", str(tmp_path / "r")]


def test_the_first_node_decides_for_the_others(tmp_path, monkeypatch):
    """Node 0 claims the run and hands its command (start or resume) to the other nodes,
    which run it without claiming or logging anything themselves."""
    from adalora_cli.sweep import slurm_job
    from adalora_cli.sweep.slurm_job import TrainJob

    run = PlannedRun("r", Path(SMOKE), "lora", None, 0, (), "")
    (tmp_path / "slurm").mkdir()
    started: list[tuple[str, list[str]]] = []

    class Done:
        returncode = 0

        def poll(self):
            return 0

    monkeypatch.setattr(TrainJob, "_start", lambda self, cmd: started.append(
        (os.environ["SLURM_NODEID"], cmd)) or Done())
    monkeypatch.setattr(slurm_job, "is_finished", lambda path: True)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1")
    monkeypatch.setenv("SLURM_NODEID", "0")
    assert TrainJob(run, tmp_path, nproc=1, nnodes=2)()["status"] == "finished"
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert TrainJob(run, tmp_path, nproc=1, nnodes=2)() == {"status": "node 1", "exit": 0}
    assert started[0][1] == started[1][1] and "--nnodes=2" in started[0][1]
    assert [e["event"] for e in events(tmp_path)] == ["started", "finished"]  # node 0's
    assert (tmp_path / "slurm" / "r.7.0.command.json").is_file()
