"""What the docs state about the code, held to the code, so that drift fails the suite.

tests/test_docs_commands.py runs every fenced ``adalora`` command through the parser and
checks links, backticked paths, the run-directory table and the method, task and config-key
lists. This file checks the rest of what the docs state:

- the flags written beside ``adalora <command>`` in prose, and beside
  ``python benchmarks/<script>.py`` anywhere, exist in that command or script;
- every config key named in prose (``train.length_split``) is a key of the config;
- every shipped file named anywhere (``configs/...``, ``experiments/...``,
  ``benchmarks/...``), fenced or not, exists, and every ``make`` target named exists;
- the README's command block names every command the CLI has, and every test target;
- the counts the docs state (model types, trackers, manifests) and the model table of
  docs/own-model.md match the code;
- the README fits in 150 lines, and no document says how its measurements were organised
  (which machine was lent for how long, what was copied onto it) instead of what they
  measured.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import typer.main

from adalora_cli.cli import app

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
README = ROOT / "README.md"
FENCE = re.compile(r"^\s*(```|~~~)")
SPAN = re.compile(r"`([^`\n]+)`")
PLACEHOLDER = re.compile(r"[<>*$…{}\[\]]|\.\.\.|XYZ|NAME|PATH")


def _text(doc: Path) -> str:
    return doc.read_text(encoding="utf-8")


def _split(text: str) -> tuple[str, str]:
    """(prose, fenced code) of a markdown text."""
    prose, code, fence = [], [], None
    for line in text.splitlines():
        mark = FENCE.match(line)
        if mark and (fence is None or mark.group(1) == fence):
            fence = None if fence else mark.group(1)
            continue
        (code if fence else prose).append(line)
    return "\n".join(prose), "\n".join(code)


def _flat(text: str) -> str:
    """Prose with its line breaks folded, so a phrase may wrap."""
    return re.sub(r"\s+", " ", text)


def _rel(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


# ---------------------------------------------------------------------- commands, flags

def _cli():
    """The CLI as click sees it (typer's own copy of click: a group has ``commands``)."""
    return typer.main.get_command(app)


def _options(command) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}


def _command(words: list[str]):
    """The (sub)command ``words`` start with, or None where the first is no command."""
    root = command = _cli()
    for word in words:
        if word not in getattr(command, "commands", {}):
            break
        command = command.commands[word]
    return None if command is root else command


def _prose_commands() -> list[tuple[str, str]]:
    """``(doc, span)`` of each inline code span of prose that is an ``adalora`` command."""
    out = []
    for doc in DOCS:
        prose, _ = _split(_text(doc))
        for span in SPAN.findall(_flat(prose)):
            if re.match(r"(\.venv/bin/)?adalora \w", span):
                out.append((_rel(doc), span))
    return out


def test_flags_beside_a_command_in_prose_exist():
    """``adalora sweep --budget`` in a sentence names an option of ``adalora sweep``
    (fenced commands go through the parser in tests/test_docs_commands.py)."""
    spans = _prose_commands()
    assert len(spans) >= 20
    wrong = []
    for where, span in spans:
        words = span.split()[1:]
        command = _command(words)
        if command is None:
            wrong.append((where, span, "no such command"))
            continue
        for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", span):
            if flag not in _options(command):
                wrong.append((where, span, flag))
    assert wrong == []


def test_the_readme_shows_every_command():
    """A new command gets a line in the README's command block."""
    _, code = _split(_section(_text(README), "Commands"))
    shown = {line.split()[1] for line in code.splitlines()
             if line.startswith("adalora ") and len(line.split()) > 1}
    assert shown == set(_cli().commands)


# Flags of other tools that the docs explain beside ours (sbatch, torchrun, pip, accelerate,
# vLLM, llama.cpp).
OTHER_TOOLS_FLAGS = {"--array", "--requeue", "--signal", "--nproc_per_node", "--standalone",
                     "--index-url", "--no-deps", "--fp16", "--mixed_precision",
                     "--enable-lora", "--max-lora-rank", "--lora-modules", "--lora",
                     "--lora-scaled", "--outfile", "--base",
                     # torchrun's rendezvous, sbatch's node count, squeue's state filter
                     "--nnodes", "--rdzv_endpoint", "--rdzv_backend", "--rdzv-endpoint",
                     "--rdzv-backend", "--nodes", "--ntasks-per-node", "--states"}


def _all_our_flags() -> set[str]:
    flags: set[str] = set()

    def walk(command):
        flags.update(_options(command))
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(_cli())
    for script in [*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "scripts").glob("*.py")]:
        flags.update(re.findall(r'"(--[a-z][\w-]*)"', script.read_text(encoding="utf-8")))
    return flags


def test_every_flag_in_prose_exists_somewhere():
    """A flag written alone in a sentence (`--per-seed`, `--format merged`) is an option of
    one of our commands or scripts, or of another tool the docs name."""
    ours = _all_our_flags()
    wrong = []
    for doc in DOCS:
        prose, _ = _split(_text(doc))
        for span in SPAN.findall(_flat(prose)):
            for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", span):
                if flag not in ours and flag not in OTHER_TOOLS_FLAGS:
                    wrong.append((_rel(doc), flag))
    assert wrong == []


def test_environment_variables_named_in_the_docs_are_read():
    """`ADALORA_PROGRESS_EVERY` and the like: something in the code or tests reads each."""
    named = {v for doc in DOCS for v in re.findall(r"\bADALORA_[A-Z_]+\b", _text(doc))}
    assert len(named) >= 3
    sources = "\n".join(p.read_text(encoding="utf-8") for folder in ("adalora_cli", "tests")
                        for p in (ROOT / folder).rglob("*.py")
                        if p.name != "test_docs_claims.py")
    assert sorted(v for v in named if v not in sources) == []


BENCH = re.compile(r"python (benchmarks/[\w]+\.py)([^`\n]*)")


def test_benchmark_commands_name_real_scripts_and_flags():
    """``python benchmarks/step_time.py --shape bart-large``, in prose or a fence: the
    script exists and parses that flag."""
    found = []
    for doc in DOCS:
        for script, rest in BENCH.findall(_text(doc)):
            found.append((_rel(doc), script, rest.split("#")[0]))
    assert len(found) >= 10
    wrong = []
    for where, script, rest in found:
        path = ROOT / script
        if not path.is_file():
            wrong.append((where, script))
            continue
        source = path.read_text(encoding="utf-8")
        for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest):
            if f'"{flag}"' not in source:
                wrong.append((where, script, flag))
    assert wrong == []


# ---------------------------------------------------------------------- config keys

_FILE_SUFFIXES = {"py", "md", "yaml", "yml", "json", "jsonl", "pt", "txt", "toml", "csv",
                  "cfg", "bin", "safetensors", "gguf", "png", "html", "tsv", "parquet"}


def test_config_keys_named_in_prose_exist():
    """``train.length_split``, ``model.base_dtype: auto``, ``adalora.score=magnitude`` in
    a sentence: each section and key is in the config (a renamed key fails here)."""
    from adalora_cli.config import RunConfig

    sections = {f.name: {g.name for g in dataclasses.fields(getattr(RunConfig(), f.name))}
                for f in dataclasses.fields(RunConfig)}
    key = re.compile(r"(?<![\w/.-])(" + "|".join(sections) + r")\.([a-z_][a-z0-9_]*)")
    named, wrong = 0, []
    for doc in DOCS:
        prose, _ = _split(_text(doc))
        for span in SPAN.findall(_flat(prose)):
            for section, name in key.findall(span):
                if name in _FILE_SUFFIXES:  # adalora.py, a file
                    continue
                named += 1
                if name not in sections[section]:
                    wrong.append((_rel(doc), f"{section}.{name}", span))
    assert named >= 100
    assert wrong == []


# ---------------------------------------------------------------------- files and targets

SHIPPED = re.compile(r"(?<![\w/.-])((?:configs|experiments|benchmarks)/[\w./-]*\w)")


def test_shipped_files_named_anywhere_exist():
    """A config, manifest or benchmark named in the docs, in a fenced command as in prose,
    exists (test_docs_commands parses fenced commands with --help, which never opens the
    file)."""
    named, missing = 0, []
    for doc in DOCS:
        for line in _text(doc).splitlines():
            for match in SHIPPED.finditer(line):
                path = match.group(1)
                if PLACEHOLDER.search(line[match.start():match.end() + 1]):
                    continue
                named += 1
                if not (ROOT / path).exists():
                    missing.append((_rel(doc), path))
    assert named >= 80
    assert missing == []


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-z][\w-]*):", text, flags=re.M))


def test_make_targets_named_in_the_docs_exist():
    targets = _make_targets()
    named = {(_rel(doc), t) for doc in DOCS
             for t in re.findall(r"(?:`|^\s*)make ([a-z][\w-]*)", _text(doc), flags=re.M)}
    assert len(named) >= 10
    assert [(doc, t) for doc, t in sorted(named) if t not in targets] == []


def test_the_readme_names_every_test_target():
    """The README says what each ``make test*`` target runs."""
    readme = _text(README)
    tests = {t for t in _make_targets() if t.startswith("test")}
    assert "test" in tests and "test-cuda" in tests
    assert [t for t in sorted(tests) if f"make {t}`" not in readme] == []


def test_doc_anchors_cited_in_code_and_manifests_resolve():
    """``docs/run-directory.md#resuming`` in a docstring, an error hint or a manifest's
    header points at a heading or anchor that exists (tests/test_docs_commands.py holds
    docs/maths.md's citations; this holds every other page's)."""
    from tests.test_docs_commands import anchors

    cited = []
    for folder, pattern in (("adalora_cli", "*.py"), ("benchmarks", "*.py"),
                            ("scripts", "*.py"), ("configs", "*.yaml"),
                            ("experiments", "*.yaml")):
        for source in (ROOT / folder).rglob(pattern):
            for page, anchor in re.findall(r"docs/([\w-]+\.md)#([\w-]+)",
                                           source.read_text(encoding="utf-8")):
                cited.append((str(source.relative_to(ROOT)), page, anchor))
    assert len(cited) >= 20
    broken = [(where, f"{page}#{anchor}") for where, page, anchor in cited
              if not (ROOT / "docs" / page).is_file()
              or anchor not in anchors(ROOT / "docs" / page)]
    assert broken == []


def test_the_exit_code_table_is_the_code_s():
    """docs/training.md's exit codes are the ``EXIT_*`` codes of adalora_cli/errors.py (and
    0), each once."""
    from adalora_cli import errors

    codes = {v for k, v in vars(errors).items() if k.startswith("EXIT_") and isinstance(v, int)}
    section = _section(_text(ROOT / "docs" / "training.md"), "Exit codes")
    table = [int(m) for m in re.findall(r"^\|\s*(\d+)\s*\|", section, flags=re.M)]
    assert sorted(table) == sorted({0, *codes})


# ---------------------------------------------------------------------- counts

WORDS = {w: n for n, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}


def _number(word: str) -> int:
    return int(word.replace(",", "")) if word[0].isdigit() else WORDS[word.lower()]


def _counts(pattern: str) -> list[tuple[str, int, str]]:
    """``(doc, stated number, phrase)`` for each match of ``pattern`` (its group 1 the
    number) in the docs, code comments included."""
    number = r"(\d[\d,]*|" + "|".join(WORDS) + r")"
    out = []
    for doc in DOCS:
        for m in re.finditer(pattern.replace("NUMBER", number), _flat(_text(doc)),
                             flags=re.I):
            out.append((_rel(doc), _number(m.group(1)), m.group(0)))
    return out


def test_the_number_of_model_types_is_the_code_s():
    from adalora_cli.methods.targets import DEFAULT_TARGETS

    stated = _counts(r"\bNUMBER model types\b")
    assert stated, "the docs no longer say how many model types have default targets"
    assert [s for s in stated if s[1] != len(DEFAULT_TARGETS)] == []


def test_the_number_of_trackers_is_the_code_s():
    from adalora_cli.config import TRACKER_SINKS

    stated = _counts(r"\b(?:all )?NUMBER trackers\b")
    assert stated
    assert [s for s in stated if s[1] != len(TRACKER_SINKS)] == []


def test_the_number_of_manifests_is_the_code_s():
    """"the 13 manifests", "all thirteen sweep manifests": the files in experiments/."""
    shipped = len(list((ROOT / "experiments").glob("*.yaml")))
    stated = _counts(r"\b(?:the|all|its|of) NUMBER (?:sweep )?manifests\b")
    assert [s for s in stated if s[1] != shipped] == []


SWEEP_COUNT = re.compile(
    r"adalora sweep (experiments/[\w-]+\.yaml)[^#\n]*#\s*(?:the plan: )?(\d[\d,]*) runs\b")


def test_the_run_counts_beside_sweep_commands_are_the_plans(monkeypatch):
    """``adalora sweep experiments/X.yaml   # 78 runs``: the manifest plans that many runs.
    How many matrices a model has sizes each run, and a run's overrides make its config,
    but neither changes how many runs there are: the count is taken without reading any
    model's config (the hub's models are not here), each config file loaded once."""
    from adalora_cli.sweep import plan as planning

    loaded: dict = {}
    real_load = planning.load_config

    def load_once(config, overrides=None):
        if str(config) not in loaded:
            loaded[str(config)] = real_load(config, [o for o in overrides or []
                                                     if o.startswith("method.")])
        return loaded[str(config)]

    monkeypatch.setattr(planning, "count_matrices", lambda *args, **kwargs: 72)
    monkeypatch.setattr(planning, "load_config", load_once)
    stated = [(_rel(doc), path, _number(n)) for doc in DOCS
              for path, n in SWEEP_COUNT.findall(_text(doc))]
    assert len(stated) >= 8
    planned = {path: len(planning.plan(planning.build_spec(ROOT / path)))
               for path in {p for _, p, _ in stated}}
    assert [(doc, path, n, planned[path]) for doc, path, n in stated
            if planned[path] != n] == []


def test_the_gated_ffn_model_types_are_the_code_s():
    """Where the docs list the model types whose FFN has three matrices, the list is the
    types whose default targets hold a gate (Llama's gate_proj, mT5's wi_0)."""
    from adalora_cli.methods.targets import DEFAULT_TARGETS

    gated = {t for t, names in DEFAULT_TARGETS.items()
             if any(n in ("gate_proj", "wi_0") for n in names)}
    lists = [(_rel(doc), m.group(1)) for doc in DOCS
             for m in re.finditer(r"gated FFNs of ((?:[a-z0-9_]+, )+[a-z0-9_]+ and [a-z0-9_]+)",
                                  _flat(_text(doc)))]
    assert {doc for doc, _ in lists} >= {"README.md", "docs/training.md"}
    for doc, listed in lists:
        assert set(re.split(r", | and ", listed)) == gated, (doc, listed)


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_the_model_table_is_the_default_targets():
    """docs/own-model.md's table names each model type once, and for each the modules the
    code adapts by default (each target, or its last dotted part)."""
    from adalora_cli.methods.targets import DEFAULT_TARGETS

    section = _section(_text(ROOT / "docs" / "own-model.md"), "Which models")
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|") and "---" not in line][1:]
    listed: list[str] = []
    for types, modules, _families in rows:
        names = set(re.findall(r"[\w.]+", modules))
        for model_type in re.findall(r"[a-z0-9_-]+", types.split("(")[0]):
            listed.append(model_type)
            missing = [t for t in DEFAULT_TARGETS[model_type]
                       if t not in names and t.split(".")[-1] not in names]
            assert missing == [], (model_type, missing)
    assert sorted(listed) == sorted(DEFAULT_TARGETS)


# ---------------------------------------------------------------------- shape and words

def test_the_readme_fits_in_150_lines():
    assert len(_text(README).splitlines()) <= 150


# How a measurement was organised, rather than what it measured: whose machine, lent for
# how long, in how many calls, what was carried onto it. "session" alone is pytest's word.
ORGANISED = [
    r"\blent\b", r"\bdevice time\b", r"\bbudget of \d+ (?:minutes|s)\b",
    r"\b(?:first|second|third|fourth|fifth|next|earlier|later|this|that|each|one|a|GPU) "
    r"sessions?\b", r"-session\b", r"\bsessions? (?:below|above)\b",
    r"\bcarr(?:y|ied|ying) (?:as wheels|there|onto)\b", r"\bwe carried\b",
    r"\bour carrying\b", r"\bcould not be carried\b", r"\bcopied (?:onto|there)\b",
    r"\b(?:in|over) (?:\d+|one|two|three|four|five|six) calls\b", r"\bcalls? of its own\b",
    r"\bthe call's\b", r"\bthe machine was\b", r"\bwe had\b", r"\bthis project's\b",
    r"\bthis VM\b",
]


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_no_doc_says_how_its_measurements_were_organised(doc):
    text = _flat(_text(doc))
    found = [m.group(0) for p in ORGANISED for m in re.finditer(p, text, flags=re.I)]
    assert found == []


def test_the_organised_words_are_caught():
    # Guards the patterns: each sentence below is the kind the docs must not hold.
    said = ["One H200, lent for 15 minutes.", "6 calls from 15:46, 830 s of device time.",
            "peft 0.21.2 carried as wheels", "the third session", "in a call of its own",
            "on this project's 2-core EPYC", "The machine was shared."]
    for sentence in said:
        assert any(re.search(p, sentence, flags=re.I) for p in ORGANISED), sentence
    assert not any(re.search(p, "the pytest session fixture; session-scoped", flags=re.I)
                   for p in ORGANISED)
