"""What runs on the PS: the TicTac gate (native, in the PS process; or the HTTP/2 proxy
in front of it), its clients and its command line.

Public names, imported on first use (TensorFlow and gRPC load only when needed):
``TicTacServer``, ``connect``, ``install_everywhere``, ``clear_everywhere``,
``stats_everywhere``, ``GateClient``, ``GateError``, ``Gate`` (the Python gate),
``build_native`` (prebuild the native gate).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TicTacServer": "tictac_hooks.enforce.server",
    "connect": "tictac_hooks.enforce.client",
    "install_everywhere": "tictac_hooks.enforce.client",
    "clear_everywhere": "tictac_hooks.enforce.client",
    "stats_everywhere": "tictac_hooks.enforce.client",
    "GateClient": "tictac_hooks.enforce.api",
    "GateError": "tictac_hooks.enforce.api",
    "Gate": "tictac_hooks.enforce.gate",
    "build_native": ("tictac_hooks.enforce.native.build", "build"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'tictac_hooks.enforce' has no attribute {name!r}")
    module, attr = target if isinstance(target, tuple) else (target, name)
    return getattr(importlib.import_module(module), attr)
