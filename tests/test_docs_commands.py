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
import importlib
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
# code can check: file names, the lists of methods and tasks, the config keys, the layout
# and layer rule of CONTRIBUTING, and its checklists (a method, a task, a tracker, a command)

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
    table (but the lock, the sweep's launch claim and a checkpoint's files, which the
    prose describes); the sweep's names are in docs/sweeps.md."""
    from adalora_cli.rundir import layout

    names = {v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str)}
    rows = _table_rows(_section(ROOT / "docs" / "run-directory.md", "Files"))[1:]
    documented = {re.split(r"[/<]", name)[0]
                  for row in rows for name in re.findall(r"`([^`]+)`", row[0])}
    assert documented <= names, documented - names
    hidden = {layout.LOCK, layout.LAUNCH, layout.CHECKPOINT_TENSORS, layout.CHECKPOINT_STATE,
              layout.CHECKPOINT_SHARDED}
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
    written into: the layer base, the builders' shared helpers, the config sections, the
    registry and the PEFT writers, and the test that ties builders to their modules; and
    the code holds the promises: each builder sits in the module the checklist says (its
    own, or that of the layer it uses), a section checks itself, a PEFT writer is keyed
    by one of our layer classes, the README has a row."""
    from adalora_cli.artifacts.peft import WRITERS, pick_writer
    from adalora_cli.config import RunConfig
    from adalora_cli.methods.base import LinearWrapper
    from adalora_cli.methods.building import fixed_rank
    from adalora_cli.methods.registry import METHODS
    from tests.methods.test_registry import test_a_builder_lives_with_the_layer_it_wraps

    needed = {_repo_file(LinearWrapper), _repo_file(fixed_rank), _repo_file(RunConfig),
              _repo_file(METHODS["lora"].size_label), _repo_file(pick_writer),
              _repo_file(test_a_builder_lives_with_the_layer_it_wraps),
              "adalora_cli/methods/<name>.py", "tests/methods/"}
    assert _checklist_paths("Adding a method") == needed
    text = _section(ROOT / "CONTRIBUTING.md", "Adding a method")
    modules = {name: spec.builder.split(":")[0] for name, spec in METHODS.items()}
    # the exceptions the checklist spells out, and the rule for every other method
    assert "rsLoRA and LoRA+ in `lora.py`, HAdapter and PAdapter in\n     `adapters.py`" in text
    assert "`none`, which add no layer at all, in `full.py`" in text
    shared = {"rslora": "lora", "loraplus": "lora", "houlsby": "adapters",
              "pfeiffer": "adapters", "none": "full"}
    assert modules == {name: shared.get(name, name) for name in METHODS}
    assert all(spec.builder.split(":")[1] == f"build_{name}" for name, spec in METHODS.items())
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


def test_the_add_a_tracker_checklist_names_exactly_the_files_the_code_needs():
    """The code files it names are the sink module plus the files a tracker is written
    into: the Sink base, the tracker table's config.py and the tracker tests; and every
    tracker of the table is what step 1 says (a ``<name>_sink.py`` module with a Sink of
    that name, PACKAGES and open_sink), with its extra in the ``tracking`` extra and its
    name in the ``log`` keys of docs/tracking.md."""
    from adalora_cli.config import TRACKER_SINKS, LogConfig
    from adalora_cli.tracking.base import Sink

    assert (ROOT / "tests" / "tracking").is_dir()
    needed = {_repo_file(Sink), _repo_file(LogConfig), "adalora_cli/tracking/<name>_sink.py",
              "tests/tracking/"}
    assert _checklist_paths("Adding a tracker") == needed
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    (tracking_extra,) = re.findall(r"^tracking = \[(.*)\]$", pyproject, flags=re.M)
    keys = (ROOT / "docs" / "tracking.md").read_text(encoding="utf-8")
    (listed,) = re.findall(r"`to` \(any of ([a-z ]+)\)", keys)
    assert listed.split() == list(TRACKER_SINKS)
    for name, module_name in TRACKER_SINKS.items():
        assert module_name == f"{name}_sink", name
        module = importlib.import_module(f"adalora_cli.tracking.{module_name}")
        sinks = [v for v in vars(module).values()
                 if isinstance(v, type) and issubclass(v, Sink) and v is not Sink]
        assert [s.name for s in sinks] == [name]
        assert module.PACKAGES and callable(module.open_sink), name
        assert re.search(rf"^{name} = \[", pyproject, flags=re.M), name
        assert name in tracking_extra, name


def _registered_commands() -> dict[str, object]:
    """Every command and group ``adalora`` has, by name, with the module that defines it."""
    from adalora_cli.cli import app

    found = {c.name: c.callback.__module__ for c in app.registered_commands}
    for group in app.registered_groups:
        callbacks = [c.callback for c in group.typer_instance.registered_commands]
        (module,) = {c.__module__ for c in callbacks}
        found[group.name] = module
    return found


def test_the_add_a_command_checklist_names_exactly_the_files_the_code_needs():
    """The code files it names are the command's module plus the files a command is written
    into: the error boundary, the command table and the help tests; and the code holds the
    promises: every module of cli/ but the boundary and the help notation is a registered
    command (or group), every command's help names a Docs page, and that page runs the
    command in a fenced block."""
    from adalora_cli import cli
    from adalora_cli.cli import boundary
    from tests.cli.test_help import test_examples_parse_and_the_page_exists as help_test

    needed = {_repo_file(boundary), _repo_file(cli), _repo_file(help_test),
              _repo_file(fenced_commands), "adalora_cli/cli/<command>.py",
              str(Path(_repo_file(help_test)).parent) + "/"}
    assert _checklist_paths("Adding a command") == needed
    registered = _registered_commands()
    modules = {f"adalora_cli.cli.{p.stem}" for p in (ROOT / "adalora_cli" / "cli").glob("*.py")
               if p.stem not in ("__init__", "boundary", "help")}
    assert sorted(modules - set(registered.values())) == [], "register these in cli/__init__"
    assert set(registered) >= set(cli.COMMANDS)
    for name in registered:
        result = runner.invoke(app, [name, "--help"])
        (page,) = re.findall(r"Docs: (docs/[\w-]+\.md)", result.output)
        assert (ROOT / page).is_file(), (name, page)
        commands = fenced_commands((ROOT / page).read_text(encoding="utf-8"))
        assert any(argv(c)[:1] == [name] for _, c in commands), (name, page)


# ---------------------------------------------------------------------------- the layout


def _layout_entries() -> list[tuple[str, str]]:
    """(folder or file, what the listing says of it) for each entry of CONTRIBUTING's
    layout block: ``adalora_cli/<unit>`` for the package's entries, the name itself for
    the top-level folders."""
    text = _section(ROOT / "CONTRIBUTING.md", "Layout")
    block = text.split("```text\n", 1)[1].split("```", 1)[0]
    entries: list[list[str]] = []
    for line in block.splitlines():
        if line.startswith("   ") and entries:  # a description carried on
            entries[-1][1] += " " + line.strip()
            continue
        name, _, rest = line.strip().partition(" ")
        if name == "adalora_cli/":
            continue
        entries.append([f"adalora_cli/{name}" if line.startswith("  ") else name, rest])
    return [(name, rest) for name, rest in entries]


def test_the_layout_names_every_module_and_nothing_else():
    """Every module of the package is named under its folder (a nested one by its path
    there, ``harness_tasks/...``), every unit and top-level module has an entry, and every
    file named exists; for benchmarks/ and scripts/ the same, file by file."""
    entries = dict(_layout_entries())
    package = ROOT / "adalora_cli"
    units = {f"adalora_cli/{p.name}" + ("/" if p.is_dir() else "")
             for p in package.iterdir()
             if (p.is_dir() and (p / "__init__.py").is_file())
             or (p.suffix == ".py" and p.name != "__init__.py")}
    listed = {name for name in entries if name.startswith("adalora_cli/")}
    assert sorted(units - listed) == [], "give these an entry in CONTRIBUTING's layout"
    assert sorted(listed - units) == [], "the layout names these, which do not exist"
    folders = [n for n in entries if n.endswith("/")]
    for folder in folders:
        where = ROOT / folder
        assert where.is_dir(), folder
        named = set(re.findall(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.(?:py|sh))\b",
                               entries[folder]))
        missing = sorted(n for n in named if not (where / n).is_file())
        assert missing == [], (folder, missing)
        if folder.startswith("adalora_cli/") or folder in ("benchmarks/", "scripts/"):
            files = {str(p.relative_to(where)) for p in where.rglob("*")
                     if p.suffix in (".py", ".sh") and p.name != "__init__.py"
                     and "__pycache__" not in p.parts}
            assert sorted(files - named) == [], (folder, "name these in the layout")


def test_the_layout_parse_reads_each_entry_whole():
    # the check above is not vacuous: an entry is read over all its carried lines
    entries = dict(_layout_entries())
    assert {"apply.py", "building.py", "full.py"} <= set(
        re.findall(r"([\w]+\.py)", entries["adalora_cli/methods/"]))
    assert "adalora_cli/errors.py" in entries and "benchmarks/" in entries


def test_the_layer_rule_diagram_follows_the_layer_test():
    from tests.test_layers import LAYERS

    text = _section(ROOT / "CONTRIBUTING.md", "The layer rule")
    diagram = text.split("```text\n", 1)[1].split("```", 1)[0]
    drawn = [set(re.findall(r"\w+", layer)) for layer in diagram.split("->")]
    assert drawn == [layer for layer in LAYERS if layer != {"__main__"}]


def test_sweeps_md_lists_every_manifest():
    """docs/sweeps.md names each manifest in experiments/ (a new one needs its line)."""
    text = (ROOT / "docs" / "sweeps.md").read_text(encoding="utf-8")
    listing = text.split("`experiments/` holds one manifest per result")[1].split("\n#")[0]
    named = set(re.findall(r"`([a-z0-9_]+)`", listing))
    shipped = {p.stem for p in (ROOT / "experiments").glob("*.yaml")}
    assert sorted(shipped - named) == [] and sorted(named - shipped) == []
