"""The control service of the proxy: the ``/tictac.Rendezvous/*`` methods (Install,
Clear, Stats, Served, Ping), served by a ``grpc.aio`` server on a private loopback port
in the proxy's event loop.

Control calls reach it through the proxy's public port: a connection whose first
request is under :data:`CONTROL_PREFIX` is routed here as a whole, so a channel should
not mix TensorFlow and control calls;
:class:`~tictac_hooks.enforce.client.RendezvousClient` uses its own. Requests and
answers are JSON (the messages are raw bytes, no protobuf).
"""

from __future__ import annotations

import json
from typing import Any

import grpc
from grpc import aio

from tictac_hooks.graph.schedule import Schedule, ScheduleError

CONTROL_SERVICE = "tictac.Rendezvous"
CONTROL_PREFIX = f"/{CONTROL_SERVICE}/"


async def dispatch(rv: Any, request: bytes, context: aio.ServicerContext,
                   method: str) -> bytes:
    """Runs control ``method`` (a full path under :data:`CONTROL_PREFIX`) on ``rv``,
    the :class:`~tictac_hooks.enforce.proxy.Rendezvous`, and returns its JSON answer."""
    verb = method[len(CONTROL_PREFIX):]
    try:
        args = json.loads(request.decode() or "{}") if request else {}
        if verb == "Install":
            schedule = Schedule.from_json(args.get("schedule"), source="installed schedule")
            result: Any = rv.gate.install(schedule, args.get("skip_after_s"),
                                          args.get("window_bytes")).to_json()
        elif verb == "Clear":
            result = {"version": rv.gate.clear()}
        elif verb == "Stats":
            result = rv.stats(include_active=args.get("include_active", True),
                              since=args.get("since")).to_json()
        elif verb == "Served":
            result = {"names": rv.gate.served_names()}
        elif verb == "Ping":
            result = {"ok": True, "upstream": rv.upstream}
        else:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                f"no method {method}; try Install, Clear, Stats, Served, Ping")
    except (ScheduleError, ValueError, TypeError) as e:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
    return json.dumps(result).encode()


class _ControlHandler(grpc.GenericRpcHandler):
    """Hands every method under :data:`CONTROL_PREFIX` to the rendezvous's ``control``."""

    def __init__(self, rendezvous: Any) -> None:
        self._r = rendezvous

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        if not method.startswith(CONTROL_PREFIX):
            return None
        r = self._r

        async def control(request, context):
            return await r.control(request, context, method)
        return grpc.unary_unary_rpc_method_handler(control)
