"""The TicTac rendezvous: a gRPC interposer in front of one TensorFlow server.

It forwards every call byte for byte (generic handlers with identity serializers on a
``grpc.aio`` server and channel, so no thread is held per call), with metadata, deadline,
status code, details and trailing metadata (including ``grpc-status-details-bin``) as
they came, and unlimited message sizes. ``/tensorflow.WorkerService/RecvTensor`` calls
are forwarded upstream at once; their responses are handed back in the installed
schedule's order by a :class:`~tictac_hooks.enforce.gate.Gate`. The control service
``/tictac.Rendezvous/*`` (JSON in, JSON out) installs and clears schedules and reads
stats; :class:`tictac_hooks.enforce.client.RendezvousClient` speaks it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any, AsyncIterator, Callable

import grpc
from grpc import aio

from tictac_hooks.enforce.gate import Gate, parse_rendezvous_key
from tictac_hooks.graph.schedule import Schedule, ScheduleError

log = logging.getLogger(__name__)

RECV_TENSOR = "/tensorflow.WorkerService/RecvTensor"
# TensorFlow's only streaming method (used when eager execution is asynchronous).
STREAM_STREAM_METHODS = frozenset({"/tensorflow.eager.EagerService/StreamingEnqueue"})
CONTROL_SERVICE = "tictac.Rendezvous"
CONTROL_PREFIX = f"/{CONTROL_SERVICE}/"
# grpcio reports TensorFlow's "infinite" deadline as about 9.2e18 s; passing that on as a
# timeout fails every call, so anything longer than this is forwarded as no deadline.
INFINITE_DEADLINE_S = 1e9
GRPC_OPTIONS = (
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
)
# Never share a port with another server by accident (gRPC sets SO_REUSEPORT by default).
SERVER_OPTIONS = GRPC_OPTIONS + (("grpc.so_reuseport", 0),)
# Metadata that gRPC itself sets on every call; the rest is forwarded as it came.
_TRANSPORT_KEYS = frozenset({"user-agent", "content-type", "te", "host", "content-length"})


def forwardable_metadata(metadata) -> tuple[tuple[str, Any], ...]:
    """Invocation metadata minus HTTP/2 pseudo headers and gRPC's reserved keys."""
    if not metadata:
        return ()
    return tuple((m[0], m[1]) for m in metadata
                 if not m[0].startswith(":") and not m[0].startswith("grpc-")
                 and m[0] not in _TRANSPORT_KEYS)


def _trailing(metadata) -> tuple[tuple[str, Any], ...]:
    """Trailing metadata to pass back: everything but the status gRPC sets itself
    (``grpc-status-details-bin`` stays)."""
    if not metadata:
        return ()
    return tuple((m[0], m[1]) for m in metadata
                 if m[0] not in ("grpc-status", "grpc-message") and not m[0].startswith(":"))


def _timeout(context: aio.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    if remaining is None or remaining > INFINITE_DEADLINE_S:
        return None
    return max(remaining, 0.0)


class Rendezvous:
    """A TicTac rendezvous in front of the TensorFlow server at ``upstream``.

    Args:
      listen: address to listen on, ``HOST:PORT`` (port 0 picks a free one; the host
        defaults to loopback when given as ``:PORT``).
      upstream: the TensorFlow server's private address, ``HOST:PORT``.
      gate: the ordering gate (default: ``Gate()``, 0.5 s skip bound).
      request_parser: bytes -> (step_id, rendezvous_key) for RecvTensor requests
        (default: TensorFlow's own RecvTensorRequest definition, see
        ``patches/tf_worker_proto.py``).

    Run it with ``await start()`` / ``await stop()`` inside an event loop, or in a
    background thread with :class:`RendezvousThread`.
    """

    def __init__(self, listen: str, upstream: str, gate: Gate | None = None,
                 request_parser: Callable[[bytes], tuple[int, str]] | None = None) -> None:
        self.listen = listen if not listen.startswith(":") else "127.0.0.1" + listen
        self.upstream = upstream
        self.gate = gate or Gate()
        self._parse = request_parser or recv_tensor_parser()
        self._server: aio.Server | None = None
        self._channel: aio.Channel | None = None
        self._unary: dict[str, Any] = {}
        self._stream: dict[str, Any] = {}
        self.port = 0
        self.started_at = 0.0

    @property
    def address(self) -> str:
        host = self.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    async def start(self) -> int:
        """Binds and starts serving; returns the bound port."""
        self._channel = aio.insecure_channel(self.upstream, options=GRPC_OPTIONS)
        self._server = aio.server(options=SERVER_OPTIONS)
        self._server.add_generic_rpc_handlers((_Handler(self),))
        try:
            self.port = self._server.add_insecure_port(self.listen)
        except RuntimeError as e:
            raise OSError(f"rendezvous cannot listen on {self.listen}: {e}; is the port "
                          "in use?") from None
        if self.port == 0:
            raise OSError(f"rendezvous cannot listen on {self.listen}: is the port in use?")
        await self._server.start()
        self.started_at = time.time()
        log.info("TicTac rendezvous on %s -> %s", self.address, self.upstream)
        return self.port

    async def stop(self, grace: float | None = 0.5) -> None:
        if self._server is not None:
            await self._server.stop(grace)
        if self._channel is not None:
            await self._channel.close()

    async def wait(self) -> None:
        await self._server.wait_for_termination()

    # -- forwarding ------------------------------------------------------------------

    def _unary_callable(self, method: str):
        mc = self._unary.get(method)
        if mc is None:
            mc = self._unary[method] = self._channel.unary_unary(method)
        return mc

    async def forward_unary(self, request: bytes, context: aio.ServicerContext,
                            method: str) -> bytes:
        call = self._unary_callable(method)(
            request, metadata=forwardable_metadata(context.invocation_metadata()),
            timeout=_timeout(context))
        try:
            response = await call
        except aio.AioRpcError as e:
            await _abort_like(context, e)
        await _pass_metadata(context, call)
        return response

    async def recv_tensor(self, request: bytes, context: aio.ServicerContext) -> bytes:
        try:
            step_id, key = self._parse(request)
        except Exception:  # noqa: BLE001 - not ours to judge; forward it untouched
            self.gate.totals["unparsed"] += 1
            return await self.forward_unary(request, context, RECV_TENSOR)
        name, dest = parse_rendezvous_key(key)
        ticket = self.gate.arrive(step_id, dest, name)
        call = self._unary_callable(RECV_TENSOR)(
            request, metadata=forwardable_metadata(context.invocation_metadata()),
            timeout=_timeout(context))
        try:
            try:
                response = await call
            except aio.AioRpcError as e:
                self.gate.ready(ticket, 0, error=e.code().name)
                self.gate.handed_back(ticket)
                await _abort_like(context, e)
            turn = self.gate.ready(ticket, len(response))
            if turn is not None:
                await turn
            await _pass_metadata(context, call)
        except asyncio.CancelledError:
            call.cancel()
            self.gate.abandon(ticket)
            raise
        self.gate.handed_back(ticket)
        return response

    async def forward_stream(self, requests: AsyncIterator[bytes],
                             context: aio.ServicerContext, method: str) -> AsyncIterator[bytes]:
        mc = self._stream.get(method)
        if mc is None:
            mc = self._stream[method] = self._channel.stream_stream(method)

        async def upstream_requests():
            async for request in requests:
                yield request

        call = mc(upstream_requests(),
                  metadata=forwardable_metadata(context.invocation_metadata()),
                  timeout=_timeout(context))
        try:
            initial = await call.initial_metadata()
            if initial:
                await context.send_initial_metadata(tuple(initial))
            async for response in call:
                yield response
        except aio.AioRpcError as e:
            await _abort_like(context, e)
        except asyncio.CancelledError:
            call.cancel()
            raise
        context.set_trailing_metadata(_trailing(await call.trailing_metadata()))

    # -- control service -------------------------------------------------------------

    async def control(self, request: bytes, context: aio.ServicerContext, method: str) -> bytes:
        verb = method[len(CONTROL_PREFIX):]
        try:
            args = json.loads(request.decode() or "{}") if request else {}
            if verb == "Install":
                schedule = Schedule.from_json(args.get("schedule"), source="installed schedule")
                result: Any = self.gate.install(schedule).to_json()
            elif verb == "Clear":
                result = {"version": self.gate.clear()}
            elif verb == "Stats":
                result = self.stats(since_step=args.get("since_step"),
                                    include_active=args.get("include_active", True))
            elif verb == "Served":
                result = {"names": self.gate.served_names()}
            elif verb == "Ping":
                result = {"ok": True}
            else:
                await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                    f"no method {method}; try Install, Clear, Stats, Served, Ping")
        except (ScheduleError, ValueError, TypeError) as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return json.dumps(result).encode()

    def stats(self, since_step: int | None = None, include_active: bool = True) -> dict[str, Any]:
        steps = self.gate.records(include_active=include_active)
        return {"ps": self.address, "upstream": self.upstream, **self.gate.summary(),
                "steps": steps}


class _Handler(grpc.GenericRpcHandler):
    """Routes every method: control, RecvTensor, streams, and everything else unary."""

    def __init__(self, rendezvous: Rendezvous) -> None:
        self._r = rendezvous
        self._cache: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        handler = self._cache.get(method)
        if handler is not None:
            return handler
        r = self._r
        if method == RECV_TENSOR:
            handler = grpc.unary_unary_rpc_method_handler(r.recv_tensor)
        elif method.startswith(CONTROL_PREFIX):
            async def control(request, context, _m=method):
                return await r.control(request, context, _m)
            handler = grpc.unary_unary_rpc_method_handler(control)
        elif method in STREAM_STREAM_METHODS:
            def stream(requests, context, _m=method):
                return r.forward_stream(requests, context, _m)
            handler = grpc.stream_stream_rpc_method_handler(stream)
        else:
            async def unary(request, context, _m=method):
                return await r.forward_unary(request, context, _m)
            handler = grpc.unary_unary_rpc_method_handler(unary)
        if len(self._cache) < 1024:
            self._cache[method] = handler
        return handler


async def _pass_metadata(context: aio.ServicerContext, call) -> None:
    initial = await call.initial_metadata()
    if initial:
        await context.send_initial_metadata(tuple(initial))
    trailing = _trailing(await call.trailing_metadata())
    if trailing:
        context.set_trailing_metadata(trailing)


async def _abort_like(context: aio.ServicerContext, error: aio.AioRpcError) -> None:
    """Ends the call with the upstream's status, details and trailing metadata."""
    initial = error.initial_metadata()
    if initial:
        try:
            await context.send_initial_metadata(tuple(initial))
        except Exception:  # noqa: BLE001 - already sent; the status still goes
            pass
    await context.abort(error.code(), error.details() or "",
                        _trailing(error.trailing_metadata()))


def recv_tensor_parser() -> Callable[[bytes], tuple[int, str]]:
    """bytes -> (step_id, rendezvous_key), with TensorFlow's RecvTensorRequest."""
    from patches.tf_worker_proto import recv_tensor_request_class

    message = recv_tensor_request_class()
    parse = message.FromString

    def parser(request: bytes) -> tuple[int, str]:
        m = parse(request)
        return m.step_id, m.rendezvous_key
    return parser


class RendezvousThread:
    """Runs a :class:`Rendezvous` on its own event loop in a daemon thread.

    Example:
      rv = RendezvousThread(Rendezvous("127.0.0.1:2222", "127.0.0.1:40001")).start()
      ...
      rv.stop()
    """

    def __init__(self, rendezvous: Rendezvous) -> None:
        self.rendezvous = rendezvous
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="tictac-rendezvous",
                                        daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.rendezvous.start())
        except BaseException as e:  # noqa: BLE001 - reported by start()
            self._error = e
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    def start(self, timeout: float = 30.0) -> "RendezvousThread":
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError(f"rendezvous on {self.rendezvous.listen} did not start "
                               f"within {timeout} s")
        if self._error is not None:
            raise self._error
        return self

    @property
    def address(self) -> str:
        return self.rendezvous.address

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Runs ``fn()`` on the rendezvous's loop (the gate is not thread-safe)."""
        async def run():
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def stop(self, grace: float | None = 0.5) -> None:
        if not self._thread.is_alive():
            return
        fut = asyncio.run_coroutine_threadsafe(self.rendezvous.stop(grace), self._loop)
        try:
            fut.result(grace + 5 if grace else 5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def join(self) -> None:
        while self._thread.is_alive():
            self._thread.join(1.0)
