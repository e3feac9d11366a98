"""One registry of what the test bed must tear down: clusters and shaped networks.

Whatever is registered here is closed, newest first (a cluster before the network its
tasks run in), when the interpreter exits and when the process gets SIGINT or SIGTERM;
the signal's previous handler runs afterwards, so Ctrl-C still interrupts. The signal
handlers are installed while something is registered (from the main thread only) and
put back when the last registered object is closed.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref
from typing import Any, Protocol


class Closeable(Protocol):
    def close(self) -> None: ...


_LIVE: "dict[int, weakref.ref[Any]]" = {}   # id -> object, in registration order
_LOCK = threading.RLock()
_PREVIOUS_HANDLERS: dict[int, Any] = {}
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def register(obj: Closeable) -> None:
    """``obj.close()`` runs at exit or on SIGINT/SIGTERM unless :func:`unregister` ran."""
    with _LOCK:
        _LIVE[id(obj)] = weakref.ref(obj)
    _install_signal_handlers()


def unregister(obj: Closeable) -> None:
    """``obj`` was closed: forget it (idempotent)."""
    with _LOCK:
        _LIVE.pop(id(obj), None)
    _restore_signal_handlers()


def live() -> list[Any]:
    """The registered objects still alive, oldest first."""
    with _LOCK:
        return [o for o in (ref() for ref in _LIVE.values()) if o is not None]


def close_all() -> None:
    """Closes every registered object, newest first; one failing does not stop the rest."""
    for obj in reversed(live()):
        try:
            obj.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
        unregister(obj)


def _on_signal(signum: int, frame: Any) -> None:
    close_all()
    previous = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_signal_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in _SIGNALS:
        current = signal.getsignal(signum)
        if current in (_on_signal, signal.SIG_IGN, None):
            continue
        _PREVIOUS_HANDLERS[signum] = current
        signal.signal(signum, _on_signal)


def _restore_signal_handlers() -> None:
    if live() or threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in list(_PREVIOUS_HANDLERS.items()):
        if signal.getsignal(signum) is _on_signal:
            signal.signal(signum, previous)
        del _PREVIOUS_HANDLERS[signum]


atexit.register(close_all)
