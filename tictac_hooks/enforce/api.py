"""The interface of a client of a PS's TicTac gate, shared by both backends: the proxy's
:class:`~tictac_hooks.enforce.client.RendezvousClient` and the native
:class:`~tictac_hooks.enforce.native.client.NativeClient`;
:func:`~tictac_hooks.enforce.client.connect` picks one."""

from __future__ import annotations

from typing import Any

from tictac_hooks.enforce.gate import InstallResult
from tictac_hooks.graph.schedule import Schedule

BACKENDS = ("native", "proxy")


class GateError(ConnectionError):
    """A PS's TicTac gate could not be reached, or refused a request (both backends)."""


class GateClient:
    """What every backend's client offers: ``ping``, ``install`` (a schedule; steps
    starting after it run under it), ``clear``, ``stats`` (totals plus one record per
    step and worker), ``served_names`` (what a schedule can name), ``close``."""

    address: str
    backend: str

    def ping(self) -> bool: ...
    def install(self, schedule: Schedule, skip_after_s: float | None = None,
                window_bytes: int | None = None) -> InstallResult: ...
    def clear(self) -> int: ...
    def stats(self, include_active: bool = True) -> dict[str, Any]: ...
    def served_names(self) -> list[str]: ...
    def close(self) -> None: ...

    def __enter__(self) -> "GateClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
