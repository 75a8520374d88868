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
