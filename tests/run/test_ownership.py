"""Issue #55: the engine (run/) and the frontends (callbacks/) own their state. No module
there assigns (or deletes) an attribute of anything but ``self``/``cls``, nor calls
setattr/delattr: an object's state changes through its own methods, so each file says
who may change what. Read with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROOMS = ("tictac_hooks/run", "tictac_hooks/callbacks")
MODULES = sorted(p for room in ROOMS for p in (ROOT / room).glob("*.py"))


def foreign_assignments(source: str) -> list[str]:
    """``line: target`` for each assignment to another object's attribute."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
            targets = ([node.target] if isinstance(node, (ast.For, ast.AsyncFor)) else
                       [i.optional_vars for i in node.items if i.optional_vars])
        elif isinstance(node, ast.NamedExpr):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, (ast.Store, ast.Del))
                        and not (isinstance(sub.value, ast.Name)
                                 and sub.value.id in ("self", "cls"))):
                    found.append(f"{sub.lineno}: {ast.unparse(sub)}")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("setattr", "delattr")):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_rooms_have_modules():
    names = {p.name for p in MODULES}
    assert {"controller.py", "check_runner.py", "driver.py", "keras_callback.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_sets_another_objects_attributes(path):
    found = foreign_assignments(path.read_text())
    assert not found, f"{path.relative_to(ROOT)} sets attributes of other objects: {found}"


@pytest.mark.parametrize("line", [
    "self.runner.installed = 'tic'",      # the mixin reaching into its runner
    "controller.order_dir = d",
    "a.b, self.c = 1, 2",
    "x.n += 1",
    "del step.start",
    "for p.t in items: pass",
    "setattr(controller, 'spread_over', 4)",
])
def test_the_check_finds_each_form(line):
    assert foreign_assignments(line), line


def test_own_attributes_and_locals_pass():
    assert foreign_assignments("self.x = 1\ncls.y = 2\nz = self.a.b\nd['k'] = v\n") == []
