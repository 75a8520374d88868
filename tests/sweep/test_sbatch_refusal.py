"""sbatch refusing a sweep's jobs is one line: sbatch's own error and what to change, exit 2.
The usual refusal: the default ``gpus_per_job=1`` on a cluster whose nodes have no GPU,
which sbatch calls an invalid generic resource; before, it ended crash-style, exit 1, after
submitit had printed sbatch's stderr.

The sbatch here is a stand-in on PATH that answers as the real one does (its error on
stderr, exit 1), so the submission goes through submitit's real SLURM executor: its sbatch
script, its call of ``sbatch <script>``, its error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app

SMOKE = "configs/smoke/glue.yaml"
GRES = "sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification"
PARTITION = ("sbatch: error: invalid partition specified: gpux\n"
             "sbatch: error: Batch job submission failed: Invalid partition name specified")


@pytest.fixture()
def slurm(tmp_path, monkeypatch):
    """A PATH whose srun does nothing and whose sbatch notes its arguments, says
    ``stderr`` and exits 1; returns the file of its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")

    def refuse(stderr: str) -> Path:
        calls = tmp_path / "sbatch-args.txt"
        (bin_dir / "sbatch").write_text(
            "#!/bin/sh\n"
            f"printf '%s\\n' \"$*\" >> {calls}\n"
            f"cat >&2 <<'EOF'\n{stderr}\nEOF\n"
            "exit 1\n")
        for name in ("srun", "sbatch"):
            (bin_dir / name).chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        return calls
    return refuse


def sweep(where: Path, *slurm_items: str):
    return CliRunner().invoke(app, ["sweep", SMOKE, "--launcher", "slurm", "--slurm",
                                    ",".join(["time=60", *slurm_items]), "--sweep-dir",
                                    str(where)])


def test_a_gres_refusal_names_gpus_per_job_0(slurm, tmp_path, in_repo):
    args = slurm(GRES)
    where = tmp_path / "s"
    result = sweep(where)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert (result.exit_code, lines) == (2, [
        "error: sbatch refused the sweep's jobs, so none was submitted: Batch job submission "
        "failed: Invalid generic resource (gres) specification; each job asks for 1 GPU "
        "(--slurm gpus_per_job=1, the default): on nodes without GPUs submit CPU jobs with "
        "--slurm gpus_per_job=0, or pick a partition with GPUs (--slurm partition=...)"])
    assert result.stdout == ""
    # submitit's own call: sbatch with the script it wrote, which asks for the GPU
    script = Path(args.read_text().split()[0])
    assert script.parent == where / "slurm" and "#SBATCH --gpus-per-node=1" in (
        script.read_text().splitlines())
    assert not (where / "slurm_jobs.json").exists()  # no job recorded: none exists
    assert not (where / "glue-adalora-s0").exists()
    # two GPUs a job: the count it asks for is named
    two = sweep(tmp_path / "two", "gpus_per_job=2")
    assert two.exit_code == 2 and ("each job asks for 2 GPUs (--slurm gpus_per_job=2): on "
                                   "nodes without GPUs") in two.stderr


def test_another_refusal_is_sbatch_s_first_error(slurm, tmp_path, in_repo):
    slurm(PARTITION)
    result = sweep(tmp_path / "s", "partition=gpux")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert (result.exit_code, lines) == (2, [
        "error: sbatch refused the sweep's jobs, so none was submitted: invalid partition "
        "specified: gpux; change what it names in --slurm (sbatch.<flag>=<value> passes any "
        "other sbatch option) and run the sweep again"])


def test_a_job_array_is_refused_the_same_way(slurm, tmp_path, in_repo):
    """Several runs go to sbatch as one job array, through another submitit path."""
    slurm(GRES)
    manifest = tmp_path / "two.yaml"
    manifest.write_text(json.dumps({"name": "two", "runs": [
        {"configs": [str(in_repo / SMOKE)], "methods": ["lora", "bitfit"]}]}))
    result = CliRunner().invoke(app, ["sweep", str(manifest), "--launcher", "slurm",
                                      "--slurm", "time=60", "--sweep-dir",
                                      str(tmp_path / "s")])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1
    assert lines[0].startswith("error: sbatch refused the sweep's jobs, so none was "
                               "submitted: Batch job submission failed: Invalid generic "
                               "resource (gres) specification; each job asks for 1 GPU")
