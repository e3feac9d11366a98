"""The layers of the package stay one way: graph core <- graph/tf <- enforce <-
callbacks <- bench.

The scheduling core (``tictac_hooks/graph/*.py``, not the ``graph/tf`` subpackage, and
``tictac_hooks/checks.py``) is framework-free: importing any of its modules imports no
TensorFlow (nor Keras), and none of them imports the TensorFlow-facing ``graph/tf`` or
anything above it. ``graph/tf/naming.py`` imports no TensorFlow either: the PS-side
Python gate parses rendezvous keys with it. ``graph/tf`` imports nothing above the
graph core but ``tictac_hooks.patches`` and ``tictac_hooks.checks``.
"""

from __future__ import annotations

import ast
import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "tictac_hooks")
FRAMEWORKS = ("tensorflow", "keras", "tf_keras")

CORE_FILES = sorted(glob.glob(os.path.join(PACKAGE, "graph", "*.py"))) + [
    os.path.join(PACKAGE, "checks.py")]
TF_FILES = sorted(glob.glob(os.path.join(PACKAGE, "graph", "tf", "*.py")))

# What the core may not import, at module level or inside a function.
CORE_FORBIDDEN = ("tictac_hooks.graph.tf", "tictac_hooks.enforce", "tictac_hooks.callbacks",
                  "tictac_hooks.bench", "tictac_hooks.patches") + FRAMEWORKS
# No exception: `tictac analyze`, which builds and profiles a Keras model, lives in
# graph/tf/cli.py and graph/tf/analyze.py.
CORE_LAZY_ALLOWED: set[tuple[str, str]] = set()
# What graph/tf may import of the package.
TF_ALLOWED = ("tictac_hooks.graph", "tictac_hooks.patches", "tictac_hooks.checks")


def module_name(path: str, root: str = ROOT) -> str:
    rel = os.path.relpath(path, root)[:-len(".py")].split(os.sep)
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def imports_of(path: str, root: str = ROOT) -> list[tuple[int, str, bool]]:
    """(line, dotted module, lazy) for every import of a file: ``import a.b``, ``from a
    import b`` (both ``a`` and ``a.b``: ``b`` may be a submodule), relative imports
    resolved, and ``importlib.import_module``/``__import__`` of a literal name. ``lazy``:
    inside a function."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    name = module_name(path, root)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name, lazy) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            found.append((node.lineno, base, lazy))
            found.extend((node.lineno, f"{base}.{a.name}", lazy) for a in node.names
                         if a.name != "*")
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Name) and node.func.id == "__import__")
                   or (isinstance(node.func, ast.Attribute)
                       and node.func.attr == "import_module"))):
            found.append((node.lineno, node.args[0].value, lazy))
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


# -- (a) importing the core imports no TensorFlow ----------------------------------------

# Runs in a fresh interpreter: imports one module and reports the import chain that
# first asked for a framework, if any.
_PROBE = r"""
import importlib, os, sys, traceback
FRAMEWORKS = {frameworks!r}
root = {root!r}
first = []

class Watch:
    def find_spec(self, name, path=None, target=None):
        if not first and name.split(".")[0] in FRAMEWORKS:
            chain = [f for f in traceback.extract_stack()[:-1]
                     if f.filename.startswith(root + os.sep)]
            first.append((name, chain))
        return None

sys.meta_path.insert(0, Watch())
importlib.import_module(sys.argv[1])
loaded = sorted(m for m in FRAMEWORKS if m in sys.modules)
if loaded or first:
    name, chain = first[0] if first else (loaded[0], [])
    print(f"importing {{sys.argv[1]}} imported {{name}}; via:")
    for f in chain:
        print(f"  {{os.path.relpath(f.filename, root)}}:{{f.lineno}}: {{f.line}}")
    sys.exit(3)
"""


def _framework_free_modules() -> list[str]:
    return [module_name(p) for p in CORE_FILES] + ["tictac_hooks.graph.tf.naming"]


def test_the_core_module_list_is_not_vacuous():
    names = _framework_free_modules()
    assert {"tictac_hooks.graph", "tictac_hooks.graph.dag", "tictac_hooks.graph.oracle",
            "tictac_hooks.graph.algorithms", "tictac_hooks.checks"} <= set(names)
    assert not any(_under(n, "tictac_hooks.graph.tf") for n in names[:-1])
    assert {"tictac_hooks.graph.tf.partition", "tictac_hooks.graph.tf.profiler"} <= {
        module_name(p) for p in TF_FILES}


@pytest.mark.parametrize("module", _framework_free_modules())
def test_importing_a_core_module_imports_no_tensorflow(module):
    code = _PROBE.format(frameworks=FRAMEWORKS, root=ROOT)
    out = subprocess.run([sys.executable, "-c", code, module], cwd=ROOT, timeout=120,
                         capture_output=True, text=True)
    assert out.returncode == 0, (
        f"{module} must import no TensorFlow (framework-free core):\n{out.stdout}{out.stderr}")


# -- (b) the core imports nothing above it -------------------------------------------------

@pytest.mark.parametrize("path", CORE_FILES, ids=lambda p: os.path.relpath(p, PACKAGE))
def test_the_core_imports_no_layer_above_it(path):
    rel = os.path.relpath(path, PACKAGE).replace(os.sep, "/")
    bad = [f"{rel}:{line}: imports {name}" + (" (in a function)" if lazy else "")
           for line, name, lazy in imports_of(path)
           if any(_under(name, p) for p in CORE_FORBIDDEN)
           and not (lazy and any(rel == r and _under(name, m) for r, m in CORE_LAZY_ALLOWED))]
    assert not bad, ("the framework-free core (tictac_hooks/graph/*.py, checks.py) may "
                     "import only itself:\n" + "\n".join(bad))


@pytest.mark.parametrize("path", TF_FILES, ids=lambda p: os.path.relpath(p, PACKAGE))
def test_graph_tf_imports_only_the_core_patches_and_checks(path):
    rel = os.path.relpath(path, PACKAGE).replace(os.sep, "/")
    bad = [f"{rel}:{line}: imports {name}" for line, name, _ in imports_of(path)
           if _under(name, "tictac_hooks") and name != "tictac_hooks"
           and not any(_under(name, p) for p in TF_ALLOWED)]
    assert not bad, ("tictac_hooks/graph/tf may import the graph core, tictac_hooks.patches "
                     "and tictac_hooks.checks only:\n" + "\n".join(bad))


def test_the_import_scan_sees_every_kind_of_import(tmp_path):
    """The static checks above are not vacuous: each form of import is found."""
    folder = tmp_path / "tictac_hooks" / "graph"
    folder.mkdir(parents=True)
    path = folder / "probe.py"
    path.write_text("import tictac_hooks.enforce.gate\n"
                    "from tictac_hooks import callbacks\n"
                    "from .tf import naming\n"
                    "def f():\n"
                    "    import tensorflow as tf\n"
                    "    importlib.import_module('tictac_hooks.bench.client')\n")
    names = {(name, lazy) for _, name, lazy in imports_of(str(path), str(tmp_path))}
    assert {("tictac_hooks.enforce.gate", False), ("tictac_hooks.callbacks", False),
            ("tictac_hooks.graph.tf", False), ("tictac_hooks.graph.tf.naming", False),
            ("tensorflow", True), ("tictac_hooks.bench.client", True)} <= names
