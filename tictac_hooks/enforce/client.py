"""Clients of the TicTac gate at a PS, one interface for both backends.

:func:`connect` returns a :class:`GateClient` for a PS address: a
:class:`~tictac_hooks.enforce.native.client.NativeClient` for a native PS (protocol
``grpc+tictac``; control through TensorFlow ops on the PS device) or a
:class:`RendezvousClient` for a PS behind the HTTP/2 interposer (its control service
``/tictac.Rendezvous/*``). ``backend="auto"`` (the default) tells them apart: the
interposer answers its Ping, a TensorFlow server answers UNIMPLEMENTED.

Example:
  from tictac_hooks.enforce.client import connect, install_everywhere
  from tictac_hooks.graph.schedule import Schedule
  results = install_everywhere(["127.0.0.1:2222"], Schedule.load("order.json"))
  stats = connect("127.0.0.1:2222").stats()
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import grpc

from tictac_hooks.enforce.api import (BACKENDS, GateClient, GateError, UnhonouredSetting,
                                      check_install_size, check_schedule_size)
from tictac_hooks.enforce.gate import InstallResult
from tictac_hooks.enforce.proxy import CONTROL_PREFIX
from tictac_hooks.graph.schedule import Schedule, ScheduleError
from tictac_hooks.records import GateStats, GateStep

if TYPE_CHECKING:
    from tictac_hooks.enforce.pool import GateClients


# The interface both backends' clients implement is in enforce/api.py; the old name of
# the error stays, since callers catch it.
RendezvousError = GateError


class RendezvousClient(GateClient):
    """Talks to one PS's rendezvous at ``address`` (the PS's address in the cluster spec).

    Args:
      address: ``HOST:PORT``.
      timeout_s: per call (default 10 s).
    """

    backend = "proxy"
    unhonoured = {
        "pace_rate": "the proxy paces by its window of bytes in flight (each answered by "
                     "the PS), not at a link rate",
        "align": "the proxy does not pace at a link rate, so it has no link to share "
                 "among the workers of a step",
    }

    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            address, options=[("grpc.max_receive_message_length", -1)])

    def close(self) -> None:
        self._channel.close()

    def _call(self, verb: str, body: dict[str, Any] | None = None) -> Any:
        method = self._channel.unary_unary(CONTROL_PREFIX + verb)
        try:
            reply = method(json.dumps(body or {}).encode(), timeout=self.timeout_s,
                           wait_for_ready=False)
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                raise ScheduleError(f"rendezvous at {self.address}: {e.details()}") from None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise RendezvousError(
                    f"{self.address} answers gRPC but has no TicTac rendezvous (is it a "
                    "plain TensorFlow server? start PS tasks with `tictac ps`)") from None
            raise RendezvousError(
                f"cannot reach the TicTac rendezvous at {self.address}: {code.name}: "
                f"{e.details()}; is the PS running, and is this its address in the "
                "cluster spec?") from None
        return json.loads(reply.decode())

    def ping(self) -> bool:
        return bool(self._call("Ping").get("ok"))

    def install(self, schedule: Schedule, skip_after_s: float | None = None,
                window_bytes: int | None = None,
                pace_rate: float | None = None, align: bool | None = None) -> InstallResult:
        """Installs ``schedule``; steps starting after this run under it. ``skip_after_s``
        also sets how long the PS waits for a scheduled transfer before skipping it,
        ``window_bytes`` the gate's look-ahead window (0: strictly one at a time).
        ``pace_rate`` and ``align`` are the native gate's pacing settings: the proxy paces
        by its window of bytes in flight (each answered by the PS), so it refuses a
        value for them (UnhonouredSetting; None: not given)."""
        self.refuse_unhonoured(pace_rate=pace_rate, align=align)
        body: dict[str, Any] = {"schedule": schedule.to_json()}
        if skip_after_s is not None:
            body["skip_after_s"] = skip_after_s
        if window_bytes is not None:
            body["window_bytes"] = window_bytes
        check_install_size(schedule, len(json.dumps(body).encode()), self.address)
        r = self._call("Install", body)
        return InstallResult(r["version"], r["transfers"], r["expected"],
                             tuple(r["unmatched"]), r["served"])

    def clear(self) -> int:
        """Removes the schedule; returns the new version number."""
        return int(self._call("Clear")["version"])

    def stats(self, include_active: bool = True, since: int | None = None) -> GateStats:
        """The gate's settings, counters and step records
        (:class:`~tictac_hooks.records.GateStats`); with ``since``, only the records
        finished after record number ``since`` (Gate.read)."""
        body: dict[str, Any] = {"include_active": include_active}
        if since is not None:
            body["since"] = since
        return GateStats.from_json(self._call("Stats", body), ps=self.address,
                                   backend="proxy")

    def served_names(self) -> list[str]:
        """Every transfer name this PS has served (what a schedule can name)."""
        return list(self._call("Served")["names"])


_DETECTED: dict[str, str] = {}  # address -> backend, as found by connect("auto")


def connect(address: str, timeout_s: float = 10.0, backend: str = "auto") -> GateClient:
    """A client for the TicTac gate of the PS at ``address`` (its cluster-spec address).

    Args:
      backend: "native", "proxy", or "auto" (default: asks the PS which it runs).
    """
    if backend not in ("auto",) + BACKENDS:
        raise ValueError(f"backend must be one of auto, native, proxy; got {backend!r}")
    from tictac_hooks.enforce import inprocess
    served_here = inprocess.lookup(address)
    if served_here is not None:  # a gate in this process (serve_in_process)
        return inprocess.InProcessClient(address, served_here)
    if backend == "auto":
        backend = _DETECTED.get(address, "")
        if not backend:
            with RendezvousClient(address, timeout_s) as probe:
                try:
                    probe.ping()
                    backend = "proxy"
                except RendezvousError as e:
                    if "no TicTac rendezvous" not in str(e):
                        raise  # not reachable at all
                    backend = "native"  # a TensorFlow server answered
            _DETECTED[address] = backend
    if backend == "proxy":
        return RendezvousClient(address, timeout_s)
    from tictac_hooks.enforce.native.client import NativeClient
    return NativeClient(address, timeout_s)


def install_everywhere(addresses: Sequence[str], schedule: Schedule,
                       timeout_s: float = 10.0, skip_after_s: float | None = None,
                       window_bytes: int | None = None,
                       pace_rate: float | None = None,
                       align: bool | None = None) -> dict[str, InstallResult]:
    """Installs ``schedule`` on every PS, all or nothing (see :func:`install_plan`)."""
    return install_plan({a: schedule for a in addresses}, timeout_s, skip_after_s,
                        window_bytes, pace_rate, align)


class InstallError(ScheduleError):
    """An install that was refused before any PS changed, or rolled back; the message
    says which PS holds what."""


def install_plan(plan: Mapping[str, Schedule], timeout_s: float = 10.0,
                 skip_after_s: float | None = None, window_bytes: int | None = None,
                 pace_rate: float | None = None, align: bool | None = None,
                 clients: "GateClients | None" = None) -> dict[str, InstallResult]:
    """Installs ``plan[address]`` on each PS, everywhere or nowhere.

    First checks everything: every PS answers and enforces, each schedule is within
    the install size limit, each PS's backend honours the settings given (not None), and, where the PSes have served transfers, the schedules
    name some of them (else: a schedule for another model). Only then installs, PS by
    PS; if one install fails, the PSes already changed are cleared again (back to
    TensorFlow's order) and :class:`InstallError` says which PS holds what.
    ``clients``: the run's :class:`GateClients` to install through (None: a client per
    PS for this install, closed after it).
    """
    from tictac_hooks.enforce.pool import GateClients
    pool = clients if clients is not None else GateClients(list(plan), connect, timeout_s)
    try:
        served: dict[str, set[str]] = {}
        for address, schedule in plan.items():
            try:
                with pool.using(address) as client:
                    client.ping()
                    served[address] = set(client.served_names())
            except GateError as e:
                raise InstallError(f"{e}; nothing was installed on any PS") from None
            check_schedule_size(schedule, address)
            try:
                client.refuse_unhonoured(skip_after_s=skip_after_s,
                                         window_bytes=window_bytes, pace_rate=pace_rate,
                                         align=align)
            except UnhonouredSetting as e:
                raise InstallError(f"{e}; nothing was installed on any PS") from None
        plan = _fresh_ones_restricted(plan, served)
        matched = {a: len(set(s.order) & served[a]) for a, s in plan.items()}
        if any(served.values()) and not any(matched[a] for a in plan if served[a]):
            example = next((s.order[0] for s in plan.values() if s.order), "(empty)")
            raise InstallError(
                f"none of the scheduled transfers (e.g. {example!r}) is a transfer these "
                "PSes have served; was the schedule computed for another model? `tictac "
                "schedule stats` lists the names they serve. Nothing was installed")
        results: dict[str, InstallResult] = {}
        for address, schedule in plan.items():
            try:
                with pool.using(address) as client:
                    results[address] = client.install(
                        schedule, skip_after_s=skip_after_s, window_bytes=window_bytes,
                        pace_rate=pace_rate, align=align)
            except (GateError, ScheduleError) as e:
                raise InstallError(f"install on {address} failed: {e}; "
                                   + _roll_back(pool, results)) from None
        return results
    finally:
        if clients is None:
            pool.close()


def _fresh_ones_restricted(plan: Mapping[str, Schedule],
                           served: Mapping[str, set[str]]) -> dict[str, Schedule]:
    """A PS that has served nothing yet (just started, or restarted) enforces every
    name its schedule lists, and would wait the skip bound for each one another PS
    serves: where other PSes of the plan have served names, its schedule leaves
    theirs out."""
    elsewhere = set().union(*served.values())
    out = dict(plan)
    for address, schedule in plan.items():
        if not served[address] and elsewhere:
            mine = [n for n in schedule.order if n not in elsewhere]
            if len(mine) < len(schedule.order):
                out[address] = schedule.restricted(mine)
    return out


def _roll_back(pool: "GateClients", done: Mapping[str, InstallResult]) -> str:
    """Clears the PSes in ``done``; says which PS holds what afterwards."""
    if not done:
        return "no PS had been changed"
    cleared, stuck = [], []
    for address, result in done.items():
        try:
            with pool.using(address) as client:
                client.clear()
            cleared.append(address)
        except GateError as e:
            stuck.append(f"{address} still enforces schedule version {result.version} "
                         f"({e}; run `tictac schedule clear --ps {address}`)")
    out = []
    if cleared:
        out.append(f"rolled back: {', '.join(cleared)} cleared again (TensorFlow's order)")
    return "; ".join(out + stuck)


def clear_everywhere(addresses: Sequence[str], timeout_s: float = 10.0,
                     clients: "GateClients | None" = None) -> None:
    """Clears every PS's order (TensorFlow's order again); through the run's
    ``clients`` when given. Every PS is tried, whichever fails: then a
    :class:`GateError` names each PS that may still hold its order, and why."""
    failed = []
    for address in addresses:
        try:
            if clients is None:
                with connect(address, timeout_s) as client:
                    client.clear()
            else:
                with clients.using(address) as client:
                    client.clear()
        except GateError as e:
            failed.append(f"{address} ({e})")
    if failed:
        cleared = len(addresses) - len(failed)
        raise GateError(f"clearing failed on {len(failed)} of {len(addresses)} PS, which "
                        f"may still hold an order: {'; '.join(failed)} ({cleared} cleared)")


def stats_everywhere(addresses: Sequence[str], timeout_s: float = 10.0) -> list[GateStats]:
    """Every PS's stats, in the order of ``addresses`` (each step record names its
    ``ps``)."""
    out = []
    for address in addresses:
        with connect(address, timeout_s) as client:
            out.append(client.stats())
    return out


def steps_everywhere(addresses: Sequence[str], timeout_s: float = 10.0) -> list[GateStep]:
    """Every PS's step records (:class:`~tictac_hooks.records.GateStep`, each naming
    its ``ps``), PS by PS, oldest first."""
    return [s for stats in stats_everywhere(addresses, timeout_s) for s in stats.steps]
