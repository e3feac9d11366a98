"""ctypes access to a native gate: this process's server gate (a native PS reads and
configures its own), or a gate alone (the conformance tests drive the C++ gate through
the same calls as the Python one)."""

from __future__ import annotations

import ctypes
import itertools
import json
import threading
from typing import Any, Callable

from tictac_hooks.enforce.gate import DEFAULT_SKIP_AFTER_S
from tictac_hooks.graph.schedule import ScheduleError

_HANDBACK = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)
_CALLBACKS: dict[int, Callable[[], None]] = {}
_CALLBACKS_LOCK = threading.Lock()
_TOKENS = itertools.count(1)


@_HANDBACK
def _dispatch(_ticket: int, ctx: int | None) -> None:
    with _CALLBACKS_LOCK:
        fn = _CALLBACKS.pop(ctx or 0, None)
    if fn is not None:
        fn()


def _library(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)  # the same handle as TensorFlow's load of the same path
    lib.tictac_gate_new.restype = ctypes.c_void_p
    lib.tictac_gate_new.argtypes = [ctypes.c_double, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.tictac_gate_delete.argtypes = [ctypes.c_void_p]
    lib.tictac_server_gate.restype = ctypes.c_void_p
    lib.tictac_gate_control.restype = ctypes.c_void_p
    lib.tictac_gate_control.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                        ctypes.POINTER(ctypes.c_int)]
    lib.tictac_gate_arrive.restype = ctypes.c_int64
    lib.tictac_gate_arrive.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_char_p]
    lib.tictac_gate_ready.restype = ctypes.c_int
    lib.tictac_gate_ready.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                      ctypes.c_char_p, _HANDBACK, ctypes.c_void_p,
                                      ctypes.c_int]
    lib.tictac_free.argtypes = [ctypes.c_void_p]
    return lib


class CGate:
    """A native gate. ``CGate.alone(path, ...)`` makes a new one (freed with
    :meth:`close`); ``CGate.server(path)`` is the gate of this process's grpc+tictac
    server, or None before that server exists."""

    def __init__(self, lib: ctypes.CDLL, handle: int, owned: bool) -> None:
        self._lib = lib
        self._handle = handle
        self._owned = owned

    @classmethod
    def alone(cls, path: str, skip_after_s: float = DEFAULT_SKIP_AFTER_S,
              presume_absent_after: int = 2, max_active_steps: int = 64,
              history: int = 256) -> "CGate":
        lib = _library(path)
        return cls(lib, lib.tictac_gate_new(skip_after_s, presume_absent_after,
                                            max_active_steps, history), True)

    @classmethod
    def server(cls, path: str) -> "CGate | None":
        lib = _library(path)
        handle = lib.tictac_server_gate()
        return cls(lib, handle, False) if handle else None

    def control(self, verb: str, arg: str = "") -> Any:
        ok = ctypes.c_int(0)
        raw = self._lib.tictac_gate_control(self._handle, verb.encode(), arg.encode(),
                                            ctypes.byref(ok))
        try:
            text = ctypes.string_at(raw).decode()
        finally:
            self._lib.tictac_free(raw)
        if not ok.value:
            raise ScheduleError(text)
        return json.loads(text)

    def arrive(self, step_id: int, key: str) -> int:
        return self._lib.tictac_gate_arrive(self._handle, step_id, key.encode())

    def ready(self, ticket: int, nbytes: int, on_handback: Callable[[], None],
              error: str = "", dead: bool = False) -> None:
        """The response of ``ticket`` is ready; ``on_handback()`` runs when the gate
        hands it back (on this thread or the gate's timer thread). ``dead``: a dead
        tensor (a loop's exit iteration), handed back at once."""
        token = next(_TOKENS)
        with _CALLBACKS_LOCK:
            _CALLBACKS[token] = on_handback
        self._lib.tictac_gate_ready(self._handle, ticket, nbytes, error.encode(), _dispatch,
                                    token, int(dead))

    def close(self) -> None:
        if self._owned and self._handle:
            self._lib.tictac_gate_delete(self._handle)
        self._handle = 0
