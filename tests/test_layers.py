"""The package's imports run one way (CONTRIBUTING.md, "The layer rule"), read from the source
with ``ast`` so that lazy imports inside functions count too:

    errors -> config -> rundir, heatmap, threads, resources -> methods, tasks, tracking -> engine
        -> artifacts -> sweep, report -> cli -> __main__

(a tune, ``sweep/tune/``, is a sweep that searches: its trials go through the sweep's
launchers, so it lives in the sweep's unit rather than on a floor of its own.)

A unit may import itself and any unit of a lower layer, never one of its own layer or above,
and no chain of imports may come back to where it started."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "adalora_cli"
LAYERS = [
    {"errors"},
    {"config"},
    {"rundir", "heatmap", "threads", "resources"},
    {"methods", "tasks", "tracking"},
    {"engine"},
    {"artifacts"},
    {"sweep", "report"},
    {"cli"},
    {"__main__"},
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every ``adalora_cli`` module that ``path`` imports, relative imports resolved."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "adalora_cli")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "adalora_cli":
                target = node.module
            else:
                continue
            for alias in node.names:  # `from . import checkpoint` imports a module
                sub = f"{target}.{alias.name}"
                found.add(sub if _exists(sub) else target)
    return found


def _exists(module: str) -> bool:
    rel = Path(*module.split("."))
    return (ROOT / rel.with_suffix(".py")).is_file() or (ROOT / rel / "__init__.py").is_file()


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "adalora_cli"


def test_every_unit_has_a_layer():
    units = {unit(m) for m in graph()} - {"adalora_cli"}
    assert units == set(RANK), f"give these a layer in LAYERS: {sorted(units ^ set(RANK))}"


def test_imports_only_go_down():
    wrong = []
    for module, targets in graph().items():
        if unit(module) == "adalora_cli":
            continue
        for target in targets:
            a, b = unit(module), unit(target)
            if b != "adalora_cli" and a != b and RANK[b] >= RANK[a]:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_no_import_circles():
    g = graph()
    circles, state = [], {}  # state: 1 while on the DFS stack, 2 when done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(g.get(node, ())):
            if nxt == node or nxt not in g:
                continue
            if state.get(nxt) == 1:
                circles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for start in sorted(g):
        if start not in state:
            visit(start, [start])
    # A package's __init__ importing its own submodules, which import a sibling through the
    # package, is a circle too: each must name the sibling module itself.
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_rule_catches_an_upward_import(tmp_path):
    """The checker itself: an engine module importing artifacts is reported."""
    source = "from ..artifacts.load import load_run\n"
    fake = PACKAGE / "engine" / "_layer_probe.py"
    fake.write_text(source)
    try:
        bad = [t for t in imports_of(fake) if unit(t) == "artifacts"]
        assert bad == ["adalora_cli.artifacts.load"]
        assert RANK["artifacts"] > RANK["engine"]
    finally:
        fake.unlink()


def test_top_of_the_package_stays_small():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top
