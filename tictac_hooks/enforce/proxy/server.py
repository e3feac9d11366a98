"""The :class:`Rendezvous` (the proxy's listening sockets, its gate and its control
service) and :class:`RendezvousThread`, which runs one on its own event loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any, Callable

from grpc import aio

from tictac_hooks.enforce.api import MAX_INSTALL_BYTES
from tictac_hooks.enforce.gate import Gate, Ticket
from tictac_hooks.enforce.proxy.connection import _Connection
from tictac_hooks.enforce.proxy.control import CONTROL_PREFIX, _ControlHandler, dispatch
from tictac_hooks.enforce.proxy.pipes import _listen, _set_nodelay
from tictac_hooks.graph.tf.naming import parse_rendezvous_key, rendezvous_key_frame
from tictac_hooks.records import GateStats

log = logging.getLogger(__name__)


class Rendezvous:
    """A TicTac rendezvous in front of the TensorFlow server at ``upstream``.

    Args:
      listen: address to listen on, ``HOST:PORT`` (port 0 picks a free one).
      upstream: the TensorFlow server's private address, ``HOST:PORT``.
      gate: the ordering gate (default: ``Gate()``, whose skip bound is
        ``DEFAULT_SKIP_AFTER_S``).
      request_parser: bytes -> (step_id, rendezvous_key) for RecvTensor request
        messages (default: TensorFlow's own RecvTensorRequest definition, see
        ``patches/tf_worker_proto.py``).
      enforcing: gate RecvTensor at all (default True; False makes it a plain
        frame-level forwarder that still records nothing).

    Run it with ``await start()`` / ``await stop()`` inside an event loop, or in a
    background thread with :class:`RendezvousThread`.
    """

    def __init__(self, listen: str, upstream: str, gate: Gate | None = None,
                 request_parser: Callable[[bytes], tuple[int, str]] | None = None,
                 enforcing: bool = True) -> None:
        self.listen = listen
        self.upstream = upstream
        self.gate = gate or Gate()
        self.enforcing = enforcing
        self._parse = request_parser or recv_tensor_parser()
        self._listeners: list[socket.socket] = []
        self._control: aio.Server | None = None
        self.control_address = ""
        self.connections: set[_Connection] = set()
        self.port = 0

    @property
    def address(self) -> str:
        host = self.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    async def start(self) -> int:
        """Binds and starts serving; returns the bound port."""
        self._control = aio.server(options=(
            ("grpc.so_reuseport", 0),
            # Install requests up to the clients' own bound (gRPC's default is 4 MiB).
            ("grpc.max_receive_message_length", MAX_INSTALL_BYTES)))
        self._control.add_generic_rpc_handlers((_ControlHandler(self),))
        control_port = self._control.add_insecure_port("127.0.0.1:0")
        await self._control.start()
        self.control_address = f"127.0.0.1:{control_port}"
        host, port = self.listen.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        try:
            self._listeners = _listen(host.strip("[]") or None, int(port))
        except OSError as e:
            await self._control.stop(None)
            raise OSError(f"the TicTac rendezvous cannot listen on {self.listen}: "
                          f"{e.strerror or e}; is the port in use?") from None
        for lsock in self._listeners:
            loop.add_reader(lsock.fileno(), self._accept, lsock)
        self.port = self._listeners[0].getsockname()[1]
        log.info("TicTac rendezvous on %s -> %s", self.address, self.upstream)
        return self.port

    def _accept(self, lsock: socket.socket) -> None:
        for _ in range(64):
            try:
                sock, _ = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. out of file descriptors: try again later
                log.warning("accept failed: %s", e)
                return
            sock.setblocking(False)
            _set_nodelay(sock)
            _Connection(self, sock).start()

    async def stop(self, grace: float | None = 0.5) -> None:
        if self._listeners:
            loop = asyncio.get_running_loop()
            for lsock in self._listeners:
                loop.remove_reader(lsock.fileno())
                lsock.close()
            self._listeners = []
            for conn in list(self.connections):
                conn.close()
        if self._control is not None:
            await self._control.stop(grace)

    def route(self, path: bytes) -> str:
        """Where a connection whose first request is for ``path`` goes: the control
        service for ``/tictac.Rendezvous/*``, else the TensorFlow server."""
        return (self.control_address if path.startswith(CONTROL_PREFIX.encode())
                else self.upstream)

    def arrive(self, message: bytes) -> Ticket | None:
        """A complete RecvTensorRequest message: registers it with the gate."""
        try:
            step_id, key = self._parse(message)
        except Exception:  # noqa: BLE001 - not ours to judge; forward it untouched
            self.gate.totals["unparsed"] += 1
            return None
        name, dest, tensor = parse_rendezvous_key(key)
        frame, iteration = rendezvous_key_frame(key)
        return self.gate.arrive(step_id, dest, name, tensor, frame, iteration)

    def stats(self, include_active: bool = True, since: int | None = None) -> GateStats:
        """The gate's summary and records; with ``since``, a cursor's read
        (:meth:`Gate.read`: the records after it, ``last_seq``, ``dropped``)."""
        return self.gate.stats(include_active, since, ps=self.address, backend="proxy",
                               upstream=self.upstream)

    async def control(self, request: bytes, context: aio.ServicerContext, method: str) -> bytes:
        """A control call (see :mod:`tictac_hooks.enforce.proxy.control`)."""
        return await dispatch(self, request, context, method)


def recv_tensor_parser() -> Callable[[bytes], tuple[int, str]]:
    """bytes -> (step_id, rendezvous_key), with TensorFlow's RecvTensorRequest."""
    from tictac_hooks.patches.tf_worker_proto import recv_tensor_request_class

    parse = recv_tensor_request_class().FromString

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
        except BaseException as e:  # noqa: BLE001 - re-raised by start()
            self._error = e
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()
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
            fut.result((grace or 0) + 5)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def join(self) -> None:
        while self._thread.is_alive():
            self._thread.join(1.0)
