"""The package's import arrows run one way: each folder uses only the folders below it.

    bench/            the benchmark harness                      (top)
    callbacks/        the frontends: TicTac, TicTacLoop, TicTacHook
    run/              the run engine: phases, check, records, settings
    cluster/          the local test bed: LocalCluster, ShapedNetwork
    enforce/          what runs on the PS: the gates, their clients, the PS server
    graph/tf/         the TensorFlow-facing extractors and profiler
    graph/            the framework-free scheduling core
    records, checks, ports, patches, cli: shared leaves            (bottom)

Every ``import``/``from ... import`` of a ``tictac_hooks`` module, at module level or
inside a function, is read with ``ast`` (nothing is imported here).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tictac_hooks"

# cli is the generic `tictac` runner: it imports no module of the package, only loads
# the subcommand modules by name when run, so any of them may hand it their argv.
LEAVES = {"records", "checks", "ports", "patches", "cli"}
# layer -> the layers it may import (besides itself and the leaves).
ALLOWED = {
    "graph": set(),
    "graph.tf": {"graph"},
    "enforce": {"graph", "graph.tf"},
    "cluster": {"graph", "enforce"},
    "flags": {"graph", "enforce"},
    "run": {"graph", "graph.tf", "enforce", "flags"},
    "callbacks": {"graph", "graph.tf", "enforce", "flags", "run"},
    "bench": {"graph", "graph.tf", "enforce", "cluster", "callbacks", "flags", "run"},
}
TOP = {"__init__"}  # the package's lazy public names


def _layer(module: str) -> str:
    parts = module.split(".")[1:]  # drop "tictac_hooks"
    if not parts:
        return "__init__"
    if parts[0] == "graph" and len(parts) > 1 and parts[1] == "tf":
        return "graph.tf"
    return parts[0]


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] if len(parts) > 1 else parts
    return ".".join(parts)


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "tictac_hooks":  # "from tictac_hooks import checks"
                out += [(node.lineno, f"tictac_hooks.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, node.module))
    return [(line, m) for line, m in out if m == "tictac_hooks" or m.startswith("tictac_hooks.")]


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if "native" not in p.parts or p.suffix == ".py")


def test_every_layer_is_known():
    layers = {_layer(_module_name(p)) for p in MODULES}
    assert layers <= set(ALLOWED) | LEAVES | TOP, layers - set(ALLOWED) - LEAVES - TOP


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_run_downward(path):
    here = _layer(_module_name(path))
    if here in TOP:
        return
    allowed = {here} | (ALLOWED.get(here, set()) if here not in LEAVES else set())
    if here in LEAVES:
        allowed = {here, "records", "checks", "ports"} if here != "patches" else {here}
    bad = []
    for line, module in _imports(path):
        there = _layer(module)
        if there in LEAVES and here not in LEAVES:
            continue
        if there not in allowed:
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {module} "
                       f"({here} -> {there} runs up or sideways)")
    assert not bad, "\n".join(bad)


def test_the_check_can_fail(tmp_path):
    """An enforce/ module importing run/ is reported (the check is not vacuous)."""
    fake = tmp_path / "tictac_hooks" / "enforce" / "bad.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from tictac_hooks.run.controller import Controller\n")
    imports = _imports(fake)
    assert imports == [(1, "tictac_hooks.run.controller")]
    assert _layer(imports[0][1]) not in ALLOWED["enforce"]


def test_setup_cfg_lists_every_package():
    """A non-editable install ships only the packages setup.cfg names."""
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    found = {_module_name(p) for p in PACKAGE.rglob("__init__.py")}
    assert found - listed == set(), f"packages missing from setup.cfg: {found - listed}"
