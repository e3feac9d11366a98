"""The TicTac rendezvous: an HTTP/2 frame-level interposer in front of one TensorFlow
server, plus its control service on the same port.

TensorFlow's gRPC connections pass through it without being terminated: every byte the
worker sends reaches the PS and every byte the PS sends reaches the worker, unchanged
and in the same order, so metadata, deadlines, status codes and details, message sizes
and streams are whatever the two ends say (nothing is re-encoded). The interposer reads
frame headers in both directions and decodes request header blocks (HPACK, to keep the
decoder's table in step) to find ``/tensorflow.WorkerService/RecvTensor`` streams. Of
those it holds back the request's DATA frames (never HEADERS, whose order HPACK
depends on) until the :class:`~tictac_hooks.enforce.gate.Gate` says it is the
transfer's turn; the counter of the transfer's (step, destination) advances when the
PS's response HEADERS come back, i.e. when the PS handed the response to gRPC. Payload
bytes are never copied into Python objects beyond what asyncio's sockets do, and no
thread waits per transfer.

Routing: gRPC clients wait for the server's SETTINGS before they send a request, so
the interposer greets each connection with an empty SETTINGS frame (and later drops the
client's ACK of it), reads the first request's path, and connects the whole connection
either to the TensorFlow server or, for ``/tictac.Rendezvous/*``, to the control
service (a ``grpc.aio`` server on a private loopback port in the same event loop). A
channel should therefore not mix TensorFlow and control calls;
:class:`~tictac_hooks.enforce.client.RendezvousClient` uses its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import threading
import time
from typing import Any, Callable

import grpc
from grpc import aio
from hpack import Decoder
from hpack.exceptions import HPACKError

from tictac_hooks.enforce.gate import Gate, Ticket, parse_rendezvous_key
from tictac_hooks.graph.schedule import Schedule, ScheduleError

log = logging.getLogger(__name__)

RECV_TENSOR = b"/tensorflow.WorkerService/RecvTensor"
CONTROL_SERVICE = "tictac.Rendezvous"
CONTROL_PREFIX = f"/{CONTROL_SERVICE}/"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, \
    WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
_HEADER = struct.Struct(">I B I")  # (length << 8 | type) split below, flags, stream
WRITE_HIGH_WATER = 8 << 20
READ_BUFFER = 1 << 20


def _frame_header(buf, pos: int) -> tuple[int, int, int, int]:
    """(payload length, type, flags, stream id) of the frame header at ``pos``."""
    word, flags, stream = _HEADER.unpack_from(buf, pos)
    return word >> 8, word & 0xFF, flags, stream & 0x7FFFFFFF


def _header_block_fragment(ftype: int, flags: int, payload) -> bytes:
    """The HPACK fragment of a HEADERS / CONTINUATION payload (padding and priority
    fields removed)."""
    start, end = 0, len(payload)
    if ftype == HEADERS:
        if flags & PADDED:
            end -= payload[0]
            start = 1
        if flags & PRIORITY_FLAG:
            start += 5
    return bytes(payload[start:end])


def _data_payload(flags: int, payload) -> bytes:
    if flags & PADDED:
        return bytes(payload[1:len(payload) - payload[0]])
    return bytes(payload)


class _Stream:
    """A RecvTensor request stream: its held DATA frames, then its ticket."""

    __slots__ = ("held", "message", "ticket", "released", "answered")

    def __init__(self) -> None:
        self.held: list[bytes] = []
        self.message = bytearray()
        self.ticket: Ticket | None = None
        self.released = False
        self.answered = False


class _Connection(asyncio.Protocol):
    """One client connection and its upstream connection."""

    def __init__(self, rv: "Rendezvous") -> None:
        self.rv = rv
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.upstream_proto: _Upstream | None = None
        self.inbuf = bytearray()          # client bytes not yet parsed
        self.pending = bytearray()        # parsed client bytes waiting for the upstream
        self.preface_seen = False
        self.drop_settings_ack = True     # the client's ACK of our greeting
        self.decoder = Decoder()
        self.header_stream = 0
        self.header_block = bytearray()
        self.first_path = b""
        self.streams: dict[int, _Stream] = {}
        self.routed = False
        self.closed = False

    # -- client side -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.client = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        transport.write(EMPTY_SETTINGS)
        self.rv.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if not self.inbuf and self.preface_seen and self.routed:
            out = self._parse(data, 0)
        else:
            self.inbuf += data
            if not self.preface_seen:
                if len(self.inbuf) < len(PREFACE):
                    return
                if bytes(self.inbuf[:len(PREFACE)]) != PREFACE:
                    log.warning("not an HTTP/2 client; closing")
                    self.client.close()
                    return
                self.pending += self.inbuf[:len(PREFACE)]
                del self.inbuf[:len(PREFACE)]
                self.preface_seen = True
            buf = bytes(self.inbuf)
            self.inbuf.clear()
            out = self._parse(buf, 0)
        if out:
            self._to_upstream(out)

    def _to_upstream(self, chunks: list) -> None:
        if self.upstream is not None:
            self.upstream.writelines(chunks)
        else:
            for c in chunks:
                self.pending += c

    def _parse(self, buf: bytes, pos: int) -> list:
        """Walks the client's frames; returns what may go upstream now, in order."""
        out: list = []
        run_start = pos
        n = len(buf)
        streams = self.streams
        while pos + 9 <= n:
            length, ftype, flags, sid = _frame_header(buf, pos)
            end = pos + 9 + length
            if end > n:
                break
            if ftype == DATA:
                stream = streams.get(sid)
                if stream is not None and not stream.released:
                    if run_start < pos:
                        out.append(buf[run_start:pos])
                    run_start = end
                    self._hold(sid, stream, buf[pos:end], flags,
                               memoryview(buf)[pos + 9:end], out)
            elif ftype == HEADERS or ftype == CONTINUATION:
                self._headers(ftype, flags, sid, memoryview(buf)[pos + 9:end])
                if not self.routed and self.header_stream == 0:
                    # First complete request header block: route, then continue.
                    if run_start < end:
                        out.append(buf[run_start:end])
                    run_start = end
                    self._route_later(out)
                    out = []
            elif ftype == SETTINGS and flags & ACK and self.drop_settings_ack:
                self.drop_settings_ack = False
                if run_start < pos:
                    out.append(buf[run_start:pos])
                run_start = end
            elif ftype == RST_STREAM:
                stream = streams.pop(sid, None)
                if stream is not None and stream.ticket is not None and not stream.answered:
                    stream.held.clear()
                    self.rv.gate.abandon(stream.ticket)
            pos = end
        if run_start < pos:
            out.append(buf[run_start:pos])
        if pos < n:
            self.inbuf += buf[pos:]
        return out

    def _headers(self, ftype: int, flags: int, sid: int, payload) -> None:
        if ftype == HEADERS:
            self.header_stream = sid
            self.header_block = bytearray()
        self.header_block += _header_block_fragment(ftype, flags, payload)
        if not flags & END_HEADERS:
            return
        block, self.header_stream = bytes(self.header_block), 0
        try:
            headers = self.decoder.decode(block, raw=True)
        except HPACKError as e:  # keep forwarding; we just cannot gate this connection
            log.warning("cannot decode request headers (%s); not gating", e)
            self.rv.gate.totals["hpack_errors"] += 1
            return
        path = next((v for k, v in headers if k == b":path"), b"")
        if not self.routed:
            self.first_path = path
        if path == RECV_TENSOR and self.rv.enforcing:
            self.streams[sid] = _Stream()

    def _hold(self, sid: int, stream: _Stream, frame: bytes, flags: int, payload,
              out: list) -> None:
        """Holds a RecvTensor stream's DATA frame; once the request message is complete,
        asks the gate, and releases the frames now (into ``out``, keeping their place
        after the stream's HEADERS) or when the future says."""
        stream.held.append(frame)
        if stream.ticket is not None:
            return
        stream.message += _data_payload(flags, payload)
        if len(stream.message) < 5:
            if flags & END_STREAM:
                self._release(sid, stream, out)
            return
        compressed = stream.message[0]
        size = int.from_bytes(stream.message[1:5], "big")
        if compressed or len(stream.message) >= 5 + size:
            ticket = None
            if not compressed:
                ticket = self.rv.arrive(bytes(stream.message[5:5 + size]))
            stream.message = bytearray()
            if ticket is None:
                self._release(sid, stream, out)
                return
            stream.ticket = ticket
            if self.upstream_proto is not None:
                self.upstream_proto.tickets[sid] = stream
            turn = self.rv.gate.request(ticket)
            if turn is None:
                self._release(sid, stream, out)
            else:
                turn.add_done_callback(lambda _f, s=sid, st=stream: self._release(s, st))
        elif flags & END_STREAM:
            self._release(sid, stream, out)

    def _release(self, sid: int, stream: _Stream, out: list | None = None) -> None:
        """Sends a held stream's DATA frames upstream: into ``out`` when called while
        parsing (so they follow everything parsed before them), else at once."""
        if stream.released:
            return
        stream.released = True
        held, stream.held = stream.held, []
        if stream.ticket is None:
            self.streams.pop(sid, None)  # not gated: nothing more to watch
        if out is not None:
            out.extend(held)
        elif held and not self.closed:
            self._to_upstream(held)

    def _route_later(self, out: list) -> None:
        self.routed = True
        for c in out:
            self.pending += c
        path = self.first_path
        target = (self.rv.control_address if path.startswith(CONTROL_PREFIX.encode())
                  else self.rv.upstream)
        self.client.pause_reading()
        asyncio.get_running_loop().create_task(self._connect(target))

    async def _connect(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        try:
            transport, proto = await loop.create_connection(
                lambda: _Upstream(self), host.strip("[]"), int(port))
        except OSError as e:
            log.warning("cannot connect to %s: %s", target, e)
            self.rv.gate.totals["upstream_connect_errors"] += 1
            self.client.close()
            return
        if self.closed:
            transport.close()
            return
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.upstream = transport
        self.upstream_proto = proto
        pending, self.pending = self.pending, bytearray()
        transport.write(bytes(pending))
        # Streams registered before the connection existed.
        for sid, stream in self.streams.items():
            if stream.ticket is not None:
                proto.tickets[sid] = stream
        self.client.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.rv.connections.discard(self)
        for stream in self.streams.values():
            if stream.ticket is not None and not stream.answered:
                self.rv.gate.abandon(stream.ticket)
        self.streams.clear()
        if self.upstream is not None:
            self.upstream.close()

    def pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.resume_reading()


class _Upstream(asyncio.BufferedProtocol):
    """The upstream side: forwards everything to the client at once, and watches frame
    headers for the response HEADERS / DATA / RST_STREAM of held RecvTensor streams.
    Reads into one reused buffer (no allocation per read); asyncio copies only what the
    client socket does not take at once."""

    def __init__(self, conn: _Connection) -> None:
        self.buffer = bytearray(READ_BUFFER)
        self.view = memoryview(self.buffer)
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self.tickets: dict[int, _Stream] = {}
        self.skip = 0              # payload bytes of the current frame still to come
        self.skip_sid = 0          # stream of that frame (DATA byte counting)
        self.partial = b""         # an incomplete frame header

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        data = self.view[:nbytes]
        conn = self.conn
        if conn.client is not None and not conn.closed:
            conn.client.write(data)
        self._watch(data)

    def _watch(self, data: bytes) -> None:
        n = len(data)
        pos = 0
        if self.skip:
            step = min(self.skip, n)
            if self.skip_sid:
                stream = self.tickets.get(self.skip_sid)
                if stream is not None:
                    stream.ticket.nbytes += step
            self.skip -= step
            pos = step
            if pos >= n:
                return
        if self.partial:
            data = self.partial + bytes(data[pos:])
            self.partial = b""
            n, pos = len(data), 0
        tickets = self.tickets
        while pos + 9 <= n:
            length, ftype, flags, sid = _frame_header(data, pos)
            pos += 9
            stream = tickets.get(sid) if sid else None
            if stream is not None:
                if ftype == HEADERS:
                    if not stream.answered:
                        stream.answered = True
                        trailers_only = bool(flags & END_STREAM)
                        self.conn.rv.gate.handed_back(
                            stream.ticket, error="status" if trailers_only else "")
                    if flags & END_STREAM:
                        self._done(sid)
                elif ftype == DATA:
                    stream.ticket.nbytes += min(length, n - pos)
                    if flags & END_STREAM:
                        self._done(sid)
                elif ftype == RST_STREAM:
                    if not stream.answered:
                        stream.answered = True
                        self.conn.rv.gate.handed_back(stream.ticket, error="reset")
                    self._done(sid)
            if pos + length > n:
                self.skip = pos + length - n
                self.skip_sid = sid if (stream is not None and ftype == DATA) else 0
                return
            pos += length
        if pos < n:
            self.partial = bytes(data[pos:n])

    def _done(self, sid: int) -> None:
        self.tickets.pop(sid, None)
        self.conn.streams.pop(sid, None)

    def connection_lost(self, exc: Exception | None) -> None:
        conn = self.conn
        for stream in list(self.tickets.values()):
            if not stream.answered:
                stream.answered = True
                conn.rv.gate.handed_back(stream.ticket, error="upstream closed")
        self.tickets.clear()
        if conn.client is not None:
            conn.client.close()

    def pause_writing(self) -> None:
        if self.conn.client is not None:
            self.conn.client.pause_reading()

    def resume_writing(self) -> None:
        if self.conn.client is not None:
            self.conn.client.resume_reading()


class Rendezvous:
    """A TicTac rendezvous in front of the TensorFlow server at ``upstream``.

    Args:
      listen: address to listen on, ``HOST:PORT`` (port 0 picks a free one).
      upstream: the TensorFlow server's private address, ``HOST:PORT``.
      gate: the ordering gate (default: ``Gate()``, 0.5 s skip bound).
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
        self._server: asyncio.base_events.Server | None = None
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
        self._control = aio.server(options=(("grpc.so_reuseport", 0),))
        self._control.add_generic_rpc_handlers((_ControlHandler(self),))
        control_port = self._control.add_insecure_port("127.0.0.1:0")
        await self._control.start()
        self.control_address = f"127.0.0.1:{control_port}"
        host, port = self.listen.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: _Connection(self), host.strip("[]") or None, int(port),
                reuse_address=True)
        except OSError as e:
            await self._control.stop(None)
            raise OSError(f"the TicTac rendezvous cannot listen on {self.listen}: "
                          f"{e.strerror or e}; is the port in use?") from None
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("TicTac rendezvous on %s -> %s", self.address, self.upstream)
        return self.port

    async def stop(self, grace: float | None = 0.5) -> None:
        if self._server is not None:
            self._server.close()
            for conn in list(self.connections):
                if conn.client is not None:
                    conn.client.close()
        if self._control is not None:
            await self._control.stop(grace)

    def arrive(self, message: bytes) -> Ticket | None:
        """A complete RecvTensorRequest message: registers it with the gate."""
        try:
            step_id, key = self._parse(message)
        except Exception:  # noqa: BLE001 - not ours to judge; forward it untouched
            self.gate.totals["unparsed"] += 1
            return None
        name, dest = parse_rendezvous_key(key)
        return self.gate.arrive(step_id, dest, name)

    def stats(self, include_active: bool = True) -> dict[str, Any]:
        return {"ps": self.address, "upstream": self.upstream, **self.gate.summary(),
                "steps": self.gate.records(include_active=include_active)}

    async def control(self, request: bytes, context: aio.ServicerContext, method: str) -> bytes:
        verb = method[len(CONTROL_PREFIX):]
        try:
            args = json.loads(request.decode() or "{}") if request else {}
            if verb == "Install":
                schedule = Schedule.from_json(args.get("schedule"), source="installed schedule")
                skip_after_s = args.get("skip_after_s")
                if skip_after_s is not None:
                    if not (isinstance(skip_after_s, (int, float)) and skip_after_s > 0):
                        raise ValueError(f"skip_after_s must be > 0 seconds, got {skip_after_s!r}")
                    self.gate.skip_after_s = float(skip_after_s)
                result: Any = self.gate.install(schedule).to_json()
            elif verb == "Clear":
                result = {"version": self.gate.clear()}
            elif verb == "Stats":
                result = self.stats(include_active=args.get("include_active", True))
            elif verb == "Served":
                result = {"names": self.gate.served_names()}
            elif verb == "Ping":
                result = {"ok": True, "upstream": self.upstream}
            else:
                await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                    f"no method {method}; try Install, Clear, Stats, Served, Ping")
        except (ScheduleError, ValueError, TypeError) as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return json.dumps(result).encode()


class _ControlHandler(grpc.GenericRpcHandler):
    def __init__(self, rendezvous: Rendezvous) -> None:
        self._r = rendezvous

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        if not method.startswith(CONTROL_PREFIX):
            return None
        r = self._r

        async def control(request, context):
            return await r.control(request, context, method)
        return grpc.unary_unary_rpc_method_handler(control)


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
