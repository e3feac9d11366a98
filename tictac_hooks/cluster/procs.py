"""Child processes that die with this process: one place for the launcher and the
shaped network.

``die_with_parent`` is a ``preexec_fn``: the child gets its own process group (so it
can be killed as a group) and SIGKILL when its parent goes (Linux
``PR_SET_PDEATHSIG``). That signal follows the *thread* that forked the child, not the
process: a child started from a short-lived thread (an executor, a fixture's helper
thread) would be killed as soon as that thread ends. :func:`on_lasting_thread` therefore
starts children from the main thread, or from one daemon thread that lives as long as
the process.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from concurrent.futures import Future
from typing import Callable, TypeVar

T = TypeVar("T")
_PR_SET_PDEATHSIG = 1

_spawner: threading.Thread | None = None
_requests: "list[tuple[Callable[[], object], Future]]" = []
_ready = threading.Condition(threading.Lock())


def die_with_parent() -> None:
    """preexec_fn: own process group, and SIGKILL when the parent dies (Linux)."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _spawn_loop() -> None:
    while True:
        with _ready:
            _ready.wait_for(lambda: _requests)
            fn, future = _requests.pop(0)
        try:
            future.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            future.set_exception(e)


def on_lasting_thread(fn: Callable[[], T]) -> T:
    """Runs ``fn`` (which starts children with :func:`die_with_parent`) on a thread that
    lives as long as this process, and returns what it returns."""
    global _spawner
    current = threading.current_thread()
    if current is threading.main_thread() or current is _spawner:
        return fn()
    future: Future = Future()
    with _ready:
        if _spawner is None or not _spawner.is_alive():
            _spawner = threading.Thread(target=_spawn_loop, name="tictac-spawner",
                                        daemon=True)
            _spawner.start()
        _requests.append((fn, future))
        _ready.notify()
    return future.result()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
