"""Every name the package's errors and docs point users to imports."""

import importlib

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
