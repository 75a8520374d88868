"""``adalora configs``: every shipped config and manifest listed once with its header's
first sentence, copied byte for byte, never over a file; a wrong name is one line with the
nearest one; and an installed wheel lists and copies the same files without the source tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.resources import describe
from tests.conftest import ROOT

runner = CliRunner()
SHIPPED = sorted(p.relative_to(ROOT).as_posix() for folder in ("configs", "experiments")
                 for p in (ROOT / folder).rglob("*.yaml"))


def listing(output: str) -> dict[str, str]:
    rows = [line.split(None, 1) for line in output.splitlines()]
    assert all(len(r) == 2 for r in rows), output
    names = [r[0] for r in rows]
    assert len(names) == len(set(names)), "a file listed twice"
    return {name: text for name, text in rows}


def one_error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), \
        result.output
    return lines[0]


@pytest.mark.parametrize("args", [["configs"], ["configs", "ls"]])
def test_every_shipped_file_is_listed_once_with_its_first_sentence(args, tmp_path,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)  # the list does not depend on where it is run
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = listing(result.stdout)
    assert list(rows) == SHIPPED  # configs, then manifests, each in name order
    assert rows["configs/glue/rte.yaml"] == ("GLUE RTE on DeBERTaV3-base — AdaLoRA at the "
                                             "0.3M budget level (b(T) = 144, r0 = 4).")
    assert rows["experiments/cpu_bf16_check.yaml"] == ("Does bf16 autocast on the CPU keep "
                                                       "the demo's accuracy?")
    # a header whose first sentence runs over several lines is one line here, whole
    assert rows["configs/smoke/glue.yaml"] == ("Smoke run: AdaLoRA on a tiny random-weight "
                                               "BERT (tests/fixtures/tiny-bert) and a "
                                               "64-example SST-2-format fixture.")


@pytest.mark.parametrize(("header", "expected"), [
    ("# One sentence. Two sentences.\nkey: 1\n", "One sentence."),
    ("# Read e.g. the second line\n# of it. Not this.\n", "Read e.g. the second line of it."),
    ("# Named in configs/demo/\n# bbc_topic.yaml: a path broken after its slash\n",
     "Named in configs/demo/bbc_topic.yaml: a path broken after its slash"),
    ("# A first paragraph\n#\n# and a second one.\n", "A first paragraph"),
    ("# Is it a question? (yes) It is.\n", "Is it a question?"),
    ("# Version 2.0 of v1.1 data\n", "Version 2.0 of v1.1 data"),
    ("key: 1  # no header\n", ""),
])
def test_describe_takes_the_headers_first_sentence(tmp_path, header, expected):
    path = tmp_path / "x.yaml"
    path.write_text(header, encoding="utf-8")
    assert describe(path) == expected


@pytest.mark.parametrize(("name", "shipped", "command"), [
    ("configs/glue/rte.yaml", "configs/glue/rte.yaml", "train"),
    ("glue/rte", "configs/glue/rte.yaml", "train"),
    ("configs/demo/rotten_tomatoes", "configs/demo/rotten_tomatoes.yaml", "train"),
    ("table1_glue", "experiments/table1_glue.yaml", "sweep"),
    ("experiments/smoke.yaml", "experiments/smoke.yaml", "sweep"),
])
def test_copy_writes_the_same_bytes_and_says_how_to_run_it(tmp_path, name, shipped, command):
    dest = tmp_path / "mine.yaml"
    result = runner.invoke(app, ["configs", "cp", name, str(dest)])
    assert result.exit_code == 0, result.output
    assert dest.read_bytes() == (ROOT / shipped).read_bytes()
    assert result.stdout.strip() == f"wrote {dest}; run it with: adalora {command} {dest}"


def test_copy_into_a_folder_keeps_the_name(tmp_path):
    (tmp_path / "existing").mkdir()
    for dest, expected in ((tmp_path / "existing", tmp_path / "existing" / "rte.yaml"),
                           (f"{tmp_path / 'new' / 'deeper'}/", tmp_path / "new" / "deeper"
                            / "rte.yaml")):
        result = runner.invoke(app, ["configs", "cp", "glue/rte", str(dest)])
        assert result.exit_code == 0, result.output
        assert expected.read_bytes() == (ROOT / "configs/glue/rte.yaml").read_bytes()


def test_copy_never_overwrites(tmp_path):
    dest = tmp_path / "mine.yaml"
    dest.write_text("my edits\n")
    line = one_error_line(runner.invoke(app, ["configs", "cp", "glue/rte", str(dest)]))
    assert line == (f"error: {dest} already exists; choose another destination (adalora "
                    "configs cp never overwrites a file)")
    assert dest.read_text() == "my edits\n"
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "rte.yaml").write_text("mine too\n")
    line = one_error_line(runner.invoke(app, ["configs", "cp", "glue/rte",
                                              str(tmp_path / "folder")]))
    assert "folder/rte.yaml already exists" in line
    assert (tmp_path / "folder" / "rte.yaml").read_text() == "mine too\n"


@pytest.mark.parametrize(("name", "expected"), [
    ("glue/rtee", "error: no shipped config or manifest is called 'glue/rtee'; did you mean "
                  "configs/glue/rte.yaml? `adalora configs` lists them"),
    ("table1-glue", "error: no shipped config or manifest is called 'table1-glue'; did you "
                    "mean experiments/table1_glue.yaml? `adalora configs` lists them"),
    ("zzzz", "error: no shipped config or manifest is called 'zzzz'; `adalora configs` "
             "lists them"),
])
def test_an_unknown_name_is_one_line_with_the_nearest(tmp_path, name, expected):
    dest = tmp_path / "mine.yaml"
    assert one_error_line(runner.invoke(app, ["configs", "cp", name, str(dest)])) == expected
    assert list(tmp_path.iterdir()) == []


def test_a_file_where_the_folder_should_be_is_one_line(tmp_path):
    (tmp_path / "plain").write_text("")
    line = one_error_line(runner.invoke(app, ["configs", "cp", "glue/rte",
                                              str(tmp_path / "plain" / "rte.yaml")]))
    assert line == f"error: {tmp_path / 'plain'} is a file, not a folder; choose another " \
                   "destination"


@pytest.mark.e2e
def test_an_installed_wheel_lists_and_copies_the_same_files(tmp_path):
    """Built from a copy of the source tree, unpacked where there is no checkout beside it,
    run from another folder: the package finds its own copy of the configs."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE",
                 "CITATION.cff"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("adalora_cli", "configs", "experiments"):
        shutil.copytree(ROOT / folder, source / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "--no-index", "-q", "-w",
                            str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("adalora-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # the lm-evaluation-harness task adalora ships (adalora eval --harness) is package data
    harness = site / "adalora_cli" / "tasks" / "harness_tasks"
    assert {"bbc_topic_chat.yaml", "bbc_topic_chat_rows.py"} <= {p.name for p in
                                                                 harness.iterdir()}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def adalora(*args: str) -> str:
        code = ("import sys, adalora_cli\n"
                f"assert adalora_cli.__file__.startswith({str(site)!r}), adalora_cli.__file__\n"
                "from adalora_cli.cli import app\n"
                f"sys.argv = ['adalora', *{list(args)!r}]\napp()")
        done = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True,
                              text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(site)})
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    assert list(listing(adalora("configs"))) == SHIPPED
    adalora("configs", "cp", "glue/rte", "rte.yaml")
    assert (elsewhere / "rte.yaml").read_bytes() == (ROOT / "configs/glue/rte.yaml").read_bytes()
