"""Every name the package's errors and docs point users to imports."""

import importlib
import io
import os
import re
import subprocess
import sys
import tokenize

import pytest


@pytest.mark.parametrize("path", [
    "tictac_hooks.enforce.TicTacServer", "tictac_hooks.enforce.connect",
    "tictac_hooks.enforce.install_everywhere", "tictac_hooks.enforce.stats_everywhere",
    "tictac_hooks.enforce.clear_everywhere", "tictac_hooks.enforce.GateClient",
    "tictac_hooks.enforce.GateError", "tictac_hooks.enforce.Gate",
    "tictac_hooks.enforce.build_native", "tictac_hooks.enforce.server.TicTacServer",
    "tictac_hooks.enforce.native.client.NativeClient",
    "tictac_hooks.enforce.native.build.build", "tictac_hooks.TicTac",
    "tictac_hooks.TicTacHook", "tictac_hooks.TicTacLoop",
])
def test_documented_names_import(path):
    module, _, name = path.rpartition(".")
    assert getattr(importlib.import_module(module), name) is not None


def test_unknown_enforce_name_is_an_attribute_error():
    import tictac_hooks.enforce as enforce
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        enforce.Nope  # noqa: B018


# -- every dotted name the package's messages, docstrings and docs give imports ---------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOTTED = re.compile(r"\btictac_hooks(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _texts():
    """(file, text) of the package's sources (their messages and docstrings), the
    patches, the examples and every Markdown document of the repository."""
    for top in ("tictac_hooks", "patches", "examples"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith((".py", ".cc", ".h")):
                    path = os.path.join(folder, name)
                    yield path, open(path, encoding="utf-8").read()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in (
            "node_modules", "bench_out", "tictac_hooks.egg-info")]
        for name in files:
            if name.endswith(".md"):
                path = os.path.join(folder, name)
                yield path, open(path, encoding="utf-8").read()


def _strings_and_comments(path, text):
    """What a user reads: string literals (messages, docstrings) and comments of a .py
    file (not its import statements); everything else as it is."""
    if not path.endswith(".py"):
        return [text]
    out = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type in (tokenize.STRING, tokenize.COMMENT) or (
                token.type == getattr(tokenize, "FSTRING_MIDDLE", -1)):
            out.append(token.string)
    return out


def documented_names():
    names = {}
    for path, text in _texts():
        for chunk in _strings_and_comments(path, text):
            for name in DOTTED.findall(chunk):
                names.setdefault(name.rstrip("."), os.path.relpath(path, ROOT))
    return names


def resolve(dotted):
    """Imports the longest module prefix of ``dotted`` and reads the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_the_scan_finds_the_names_messages_give():
    names = documented_names()
    # Non-vacuous: the names of the controller's and the launcher's messages are seen.
    assert "tictac_hooks.enforce.server.TicTacServer" in names
    assert "tictac_hooks.TicTacLoop" in names
    assert len(names) > 20


@pytest.mark.parametrize("dotted,source", sorted(documented_names().items()))
def test_every_name_in_messages_and_docs_imports(dotted, source):
    try:
        obj = resolve(dotted)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"{source} names {dotted}, which does not import: {e}")
    assert obj is not None


def test_enforce_names_are_reachable_from_import_tictac_hooks_alone():
    """`import tictac_hooks` then `tictac_hooks.enforce.TicTacServer`, as a message
    reads, in a fresh interpreter (no other module imported first)."""
    code = ("import tictac_hooks, sys; "
            "assert tictac_hooks.enforce.TicTacServer.__name__ == 'TicTacServer'; "
            "assert tictac_hooks.graph.schedule.Schedule; "
            "assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=ROOT)
