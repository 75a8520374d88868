"""The docs cannot drift from the CLI: every ``adalora ...`` line in a fenced code block of
README.md, CONTRIBUTING.md and docs/*.md goes through the real command-line parser.

Each command runs in-process with ``--help`` appended: typer/click still parses the
command name and every option before printing help, so a renamed subcommand or option
fails here, while placeholders such as ``RUN_DIR`` or ``$task`` cost nothing. On top:

- the ``key=value`` overrides of a ``train`` or ``sweep`` command whose source is a config
  file are applied with the real config loader, so a documented key that does not exist
  (or a value of the wrong type) fails too;
- documented ``--dry-run`` commands on the offline smoke fixtures run for real;
- every relative link and anchor in the docs, and every anchor of ``docs/maths.md`` that the
  code cites, points at something that exists.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adalora_cli.cli import app
from adalora_cli.config import load_config

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
# A command line: optional prompt, then the CLI as installed (`adalora`) or from the venv.
COMMAND = re.compile(r"^\s*(?:\$\s+)?(?:\.venv/bin/)?adalora\s")
FENCE = re.compile(r"^\s*(```|~~~)")
runner = CliRunner()


def fenced_commands(text: str) -> list[tuple[int, str]]:
    """``(line number, command)`` of each ``adalora`` line inside a fenced block, with
    backslash continuations joined."""
    found: list[tuple[int, str]] = []
    fence: str | None = None
    pending: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        mark = FENCE.match(line)
        if mark and (fence is None or mark.group(1) == fence):
            fence = None if fence else mark.group(1)
            pending = None
            continue
        if fence is None:
            continue
        if pending is not None:
            start, so_far = pending
            line_text = so_far + " " + line.strip()
        elif COMMAND.match(line):
            start, line_text = number, line.strip()
        else:
            continue
        if line_text.endswith("\\"):
            pending = (start, line_text[:-1].rstrip())
        else:
            pending = None
            found.append((start, line_text))
    return found


def argv(command: str) -> list[str]:
    words = shlex.split(command, comments=True)
    if words and words[0] == "$":
        words = words[1:]
    assert words and words[0].endswith("adalora"), command
    return words[1:]


def all_commands() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for number, command in fenced_commands(doc.read_text(encoding="utf-8")):
            out.append((f"{doc.relative_to(ROOT)}:{number}", command))
    return out


COMMANDS = all_commands()


@pytest.fixture()
def cli_env(monkeypatch):
    """Run from the repository root, as a reader of the docs does; the CLI's callback fills
    in thread defaults in os.environ, which must not leak into other tests."""
    monkeypatch.chdir(ROOT)
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_the_docs_have_commands_of_every_kind():
    # Guards the extraction itself: if fences or prompts changed shape and nothing matched,
    # the parametrized test below would pass vacuously.
    names = {argv(c)[0] for _, c in COMMANDS if argv(c)}
    assert {"train", "sweep", "report", "export", "eval", "predict"} <= names
    assert len(COMMANDS) >= 40


def test_extraction_joins_continuations_and_skips_prose():
    text = "\n".join([
        "adalora train not/in/a/fence.yaml",
        "```bash",
        "$ adalora sweep a.yaml --launcher slurm \\",
        "    --slurm time=1:00:00   # trailing comment",
        "  adalora report runs/",
        "torchrun -m adalora_cli train x.yaml",
        "```",
    ])
    found = fenced_commands(text)
    assert found == [(3, "$ adalora sweep a.yaml --launcher slurm --slurm time=1:00:00   "
                         "# trailing comment"), (5, "adalora report runs/")]
    assert argv(found[0][1]) == ["sweep", "a.yaml", "--launcher", "slurm", "--slurm",
                                 "time=1:00:00"]


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_command_parses(where, command, cli_env):
    args = argv(command)
    result = runner.invoke(app, [*args, "--help"])
    assert result.exit_code == 0, f"{where}: {command}\n{result.output}"
    assert "Usage:" in result.output, f"{where}: {command}\n{result.output}"


def _config_and_overrides(args: list[str]) -> tuple[str, list[str]] | None:
    """For ``train CONFIG k=v ...`` and ``sweep CONFIG k=v ...`` with a real config file:
    the config and its overrides (options and their values left out)."""
    if not args or args[0] not in ("train", "sweep") or "--resume" in args:
        return None
    positional, skip = [], False
    for word in args[1:]:
        if skip:
            skip = False
        elif word.startswith("-"):
            skip = "=" not in word and word not in ("--dry-run", "--quiet", "-q", "--status",
                                                      "--wait")
        else:
            positional.append(word)
    if not positional or not positional[0].startswith("configs/"):
        return None
    return positional[0], positional[1:]


CONFIGURED = [(w, c) for w, c in COMMANDS
              if "$" not in c and _config_and_overrides(argv(c)) is not None]


def test_some_documented_overrides_are_checked():
    assert len(CONFIGURED) >= 10


@pytest.mark.parametrize(("where", "command"), CONFIGURED, ids=[w for w, _ in CONFIGURED])
def test_documented_overrides_are_real_keys(where, command, cli_env):
    config, overrides = _config_and_overrides(argv(command))
    load_config(config, overrides)  # raises ConfigError naming the key


SMOKE = ("configs/smoke/", "experiments/smoke.yaml")  # offline fixtures: a dry run is quick
DRY = [(w, c) for w, c in COMMANDS if "--dry-run" in c and any(s in c for s in SMOKE)]


@pytest.mark.parametrize(("where", "command"), DRY, ids=[w for w, _ in DRY])
def test_documented_smoke_dry_run_runs(where, command, cli_env):
    result = runner.invoke(app, argv(command))
    assert result.exit_code == 0, f"{where}: {command}\n{result.output}"


# ---------------------------------------------------------------------------- links

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced blocks (code is not a link)."""
    keep, fence = [], None
    for line in text.splitlines():
        mark = FENCE.match(line)
        if mark and (fence is None or mark.group(1) == fence):
            fence = None if fence else mark.group(1)
            continue
        if fence is None:
            keep.append(line)
    return "\n".join(keep)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file, plus explicit ``<a id=...>``."""
    text = _prose(path.read_text(encoding="utf-8"))
    out = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M):
        out.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return out


def test_anchor_slugs_follow_github():
    assert "one-run-on-many-gpus" in anchors(ROOT / "docs" / "training.md")
    assert "budget-schedule" in anchors(ROOT / "docs" / "maths.md")


def _links() -> list[tuple[str, Path, str]]:
    out = []
    for doc in DOCS:
        for target in LINK.findall(_prose(doc.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not ours to check
                continue
            path, _, anchor = target.partition("#")
            out.append((f"{doc.relative_to(ROOT)} -> {target}",
                        (doc.parent / path).resolve() if path else doc, anchor))
    return out


def test_doc_links_resolve():
    links = _links()
    assert len(links) >= 30
    broken = [where for where, path, anchor in links
              if not path.exists() or (anchor and path.suffix == ".md"
                                       and anchor not in anchors(path))]
    assert broken == []


def test_code_citations_of_maths_resolve():
    cited = {}
    for folder in ("adalora_cli", "tests", "benchmarks"):
        for source in (ROOT / folder).rglob("*.py"):
            for anchor in re.findall(r"docs/maths\.md#([\w-]+)", source.read_text("utf-8")):
                cited.setdefault(anchor, str(source.relative_to(ROOT)))
    assert len(cited) >= 5
    missing = {a: where for a, where in cited.items()
               if a not in anchors(ROOT / "docs" / "maths.md")}
    assert missing == {}


PATH_IN_CODE = re.compile(
    r"`((?:adalora_cli|tests|configs|experiments|benchmarks|scripts|docs)/[^`\s]*)`")


def test_paths_named_in_the_docs_exist():
    """A file or folder of the repository named in prose (``tests/test_layers.py``,
    ``docs/maths.md#masking``) exists, so moving a file without updating the docs fails;
    names with placeholders are skipped."""
    named = []
    for doc in DOCS:
        for path in PATH_IN_CODE.findall(_prose(doc.read_text(encoding="utf-8"))):
            if not re.search(r"[<>*$…]|\.\.\.", path):
                named.append((str(doc.relative_to(ROOT)), path))
    assert len(named) >= 10
    missing = []
    for doc, named_path in named:
        path, _, anchor = named_path.partition("#")
        target = ROOT / path.rstrip("/")
        if not target.exists() or (anchor and anchor not in anchors(target)):
            missing.append((doc, named_path))
    assert missing == []


# ---------------------------------------------------------------------------- claims the
# code can check: file names, the lists of methods and tasks, the config keys, and the
# add-a-method / add-a-task checklists

def _section(doc: Path, heading: str) -> str:
    """The text of one ``## heading`` section (up to the next heading of that level)."""
    text = doc.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def _table_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|") and "---" not in line]


def test_the_run_directory_table_names_the_layouts_files():
    """docs/run-directory.md's table and rundir/layout.py name the same files: every file
    of the table is a layout name, and every layout name of a run directory is in the
    table (but the lock, the sweep's launch claim and a checkpoint's two files, which the
    prose describes); the sweep's names are in docs/sweeps.md."""
    from adalora_cli.rundir import layout

    names = {v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str)}
    rows = _table_rows(_section(ROOT / "docs" / "run-directory.md", "Files"))[1:]
    documented = {re.split(r"[/<]", name)[0]
                  for row in rows for name in re.findall(r"`([^`]+)`", row[0])}
    assert documented <= names, documented - names
    hidden = {layout.LOCK, layout.LAUNCH, layout.CHECKPOINT_TENSORS, layout.CHECKPOINT_STATE}
    run_files = names - set(layout.SWEEP_FILES) - hidden
    assert run_files <= documented, run_files - documented
    sweeps = (ROOT / "docs" / "sweeps.md").read_text(encoding="utf-8")
    assert all(f"`{n}" in sweeps for n in layout.SWEEP_FILES), layout.SWEEP_FILES
    prose = (ROOT / "docs" / "run-directory.md").read_text(encoding="utf-8")
    assert all(n in prose for n in hidden)


def test_method_lists_come_from_the_registry():
    from adalora_cli.config import MethodConfig
    from adalora_cli.methods.registry import METHODS

    readme = _table_rows(_section(ROOT / "README.md", "Methods"))
    assert {row[0].strip("`") for row in readme[1:len(METHODS) + 1]} == set(METHODS)
    keys = _section(ROOT / "docs" / "training.md", "Config keys")
    (named,) = re.findall(r"`name` \(([a-z ]+)\), `target_modules`", keys)
    assert sorted(named.split()) == sorted(METHODS)
    name_doc = inspect.getsource(MethodConfig).split("target_modules")[0]  # method.name's
    assert [m for m in METHODS if m not in name_doc] == []


def test_task_lists_come_from_the_task_registry():
    from adalora_cli.tasks import TASKS

    keys = _section(ROOT / "docs" / "training.md", "Config keys")
    (row,) = [r for r in _table_rows(keys) if r[0] == "`task`"]
    listed = re.search(r"`name` \(([^)]*)\)", row[1]).group(1)
    assert set(TASKS) <= set(re.findall(r"[a-z0-9_]+", listed)), listed
    tasks = _section(ROOT / "docs" / "training.md", "Tasks")
    assert [t for t in TASKS if t not in tasks] == []
    smoke = {p.stem for p in (ROOT / "configs" / "smoke").glob("*.yaml")}
    listed = tasks.split("smoke config on tiny local models in `configs/smoke/`")[1]
    assert smoke == set(re.findall(r"`(\w+)`", listed.split(": seconds")[0]))
    config_source = inspect.getsource(load_config.__globals__["TaskConfig"])
    assert [t for t in TASKS if t not in config_source.split("dataset:")[0]] == []


def test_the_config_keys_table_has_every_key():
    from adalora_cli.config import RunConfig

    rows = {r[0].strip("`"): r[1] for r in
            _table_rows(_section(ROOT / "docs" / "training.md", "Config keys"))[1:]}
    defaults = RunConfig()
    for section in dataclasses.fields(RunConfig):
        names = [f.name for f in dataclasses.fields(getattr(defaults, section.name))]
        missing = [n for n in names if f"`{n}`" not in rows.get(section.name, "")]
        assert missing == [], (section.name, missing)


def _checklist_paths(heading: str) -> set[str]:
    text = _section(ROOT / "CONTRIBUTING.md", heading)
    text = text[text.index("\n1. "):]  # the numbered steps
    return {p.split("#")[0] for p in re.findall(r"`((?:adalora_cli|tests|configs)/[^`\s]*)`",
                                                 text)}


def _repo_file(obj) -> str:
    return str(Path(inspect.getsourcefile(obj)).resolve().relative_to(ROOT))


def test_the_add_a_method_checklist_names_exactly_the_files_the_code_needs():
    """The code files it names are the method's module plus the files a method must be
    written into: the layer base, the config sections, the registry and the PEFT writers;
    and the code holds the promises: a section checks itself, a PEFT writer is keyed by
    one of our layer classes, the README has a row."""
    from adalora_cli.artifacts.peft import WRITERS, pick_writer
    from adalora_cli.config import RunConfig
    from adalora_cli.methods.base import LinearWrapper
    from adalora_cli.methods.registry import METHODS

    needed = {_repo_file(LinearWrapper), _repo_file(RunConfig),
              _repo_file(METHODS["lora"].size_label), _repo_file(pick_writer),
              "adalora_cli/methods/<name>.py", "tests/methods/"}
    assert _checklist_paths("Adding a method") == needed
    readme = _section(ROOT / "README.md", "Methods")
    for name, spec in METHODS.items():
        if spec.section:
            section = type(getattr(RunConfig(), spec.section))
            assert "__post_init__" in vars(section), (name, spec.section)
        assert f"| `{name}` |" in readme, name
    assert all(issubclass(layer, LinearWrapper) for layer in WRITERS)


def test_the_add_a_task_checklist_names_exactly_the_files_the_code_needs():
    """The code files it names are the family's module plus the files a family must be
    written into: the Task base, the registration, the report columns, its smoke config
    and the family test's prediction rows; and every family has the last three."""
    from adalora_cli import tasks
    from adalora_cli.tasks.base import Task
    from adalora_cli.tasks.columns import REPORTS, task_report
    from tests.test_families import PREDICT_INPUT
    from tests.test_families import (
        test_every_family_has_a_smoke_config_and_is_a_task as test_every_family_is_named,
    )

    assert "causal_lm" in REPORTS  # the table the checklist's step 3 names
    needed = {_repo_file(Task), _repo_file(tasks.get_task), _repo_file(task_report),
              _repo_file(test_every_family_is_named), "adalora_cli/tasks/<family>.py",
              "configs/<family>/<task>.yaml", "configs/smoke/<family>.yaml",
              "tests/fixtures/", "tests/tasks/"}
    assert _checklist_paths("Adding a task") == needed
    for target in tasks.FAMILIES:
        family = target.split(":")[0]
        assert (ROOT / "configs" / "smoke" / f"{family}.yaml").is_file(), family
        assert family in PREDICT_INPUT, family
