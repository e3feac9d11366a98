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
PS's response HEADERS come back, i.e. when the PS handed the response to gRPC. No
thread waits per transfer.

Forwarding cost: each direction is a :class:`_Pipe`, non-blocking sockets driven by the
event loop's ``add_reader``/``add_writer`` (no asyncio transports): ``recv_into`` one
preallocated buffer, scan the frame headers in place, ``send``/``sendmsg`` views of that
buffer. Payload bytes are never copied in user space (only HPACK header blocks and held
RecvTensor request frames, both small, are); when a destination is slow the pipe stops
reading, so backpressure goes to the sender's TCP window and HTTP/2 flow control rather
than into a queue. What is left is the kernel's two extra socket copies per byte.
(Splicing large DATA payloads socket -> kernel pipe -> socket instead was tried and
left out: on loopback it saved the PS little CPU and made the worker's copies dearer, so
PS + worker CPU per GiB and the throughput ratio both got worse. perf on a raw-socket
model of it shows why: the receiver then copies pages the sender wrote long before,
no longer in cache, and its copy takes twice as long, 0.24 instead of 0.12 CPU-s per
GiB, for any pipe size from 64 KiB to 1 MiB. ``benchmarks/bench_rendezvous.py --only
floor`` measures what one extra copying hop costs with no rendezvous logic at all.)

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
import collections
import itertools
import json
import logging
import mmap
import socket
import struct
import threading
from typing import Any, Callable

import grpc
from grpc import aio
from hpack import Decoder
from hpack.exceptions import HPACKError

from tictac_hooks import checks
from tictac_hooks.enforce.api import MAX_INSTALL_BYTES
from tictac_hooks.checks import check_window
from tictac_hooks.enforce.gate import Gate, Ticket
from tictac_hooks.graph.tf.naming import parse_rendezvous_key
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
RESPONSE_BUFFER = 4 << 20  # per connection, upstream -> client (tensors)
REQUEST_BUFFER = 256 << 10  # per connection, client -> upstream (requests)
MIN_READ = 64 << 10        # least room worth a read while output is pending
READS_PER_WAKEUP = 16


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


class RequestPaths:
    """The ``:path`` of each request header block, decoding every block in order so the
    HPACK table stays in step with the client's encoder.

    gRPC encodes a repeated request's headers as indexed fields alone; such a block
    leaves the table unchanged, so the same bytes mean the same headers until a block
    that does change the table (a literal, a size update), which clears the cache.
    Decoding every block in pure Python was a third of the rendezvous's CPU time.
    """

    def __init__(self, max_cached: int = 64) -> None:
        self.decoder = Decoder()
        self.cache: dict[bytes, bytes] = {}
        self.max_cached = max_cached

    def path(self, block: bytes) -> bytes:
        """Raises hpack's HPACKError for a block that does not decode."""
        path = self.cache.get(block)
        if path is not None:
            return path
        headers = self.decoder.decode(block, raw=True)
        path = next((v for k, v in headers if k == b":path"), b"")
        if _only_indexed(block):
            if len(self.cache) >= self.max_cached:
                self.cache.clear()
            self.cache[block] = path
        else:
            self.cache.clear()
        return path


def _only_indexed(block: bytes) -> bool:
    """Whether an HPACK header block consists of indexed header fields alone (RFC 7541
    section 6.1), so that decoding it leaves the dynamic table unchanged."""
    i, n = 0, len(block)
    while i < n:
        b = block[i]
        if not b & 0x80:
            return False  # a literal, or a dynamic table size update
        i += 1
        if b & 0x7F == 0x7F:  # the index continues in 7-bit groups
            while i < n and block[i] & 0x80:
                i += 1
            i += 1
    return i == n


def _set_nodelay(sock: socket.socket) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


# What the request scanner does with the frame it is in.
_PASS, _COLLECT, _DROP = 0, 1, 2


class _Stream:
    """A RecvTensor request stream: its held DATA frames, then its ticket."""

    __slots__ = ("held", "message", "ticket", "released", "answered")

    def __init__(self) -> None:
        self.held: list[bytes] = []
        self.message = bytearray()
        self.ticket: Ticket | None = None
        self.released = False
        self.answered = False


class _Pipe:
    """One direction of a connection: ``src`` socket -> ``dst`` socket through one
    preallocated buffer (anonymous memory).

    What is read goes to ``scan`` (the connection's frame scanner for this direction),
    which appends what may go on, in order, to ``out``: views of the buffer (never
    copied) or small ``bytes`` (held or reassembled frames). ``out`` is written with
    ``send``/``sendmsg`` straight from those views. While output is pending the pipe
    keeps reading into the rest of the buffer; when less than ``MIN_READ`` is left it
    stops reading until the destination has taken everything, so backpressure reaches
    the source's TCP window (and from there HTTP/2 flow control) without any copy or
    unbounded queue. The buffer is reused from its start whenever ``out`` is empty.
    """

    __slots__ = ("conn", "loop", "src", "dst", "buf", "view", "size", "tail", "out",
                 "reading", "writing", "paused", "scan", "closing")

    def __init__(self, conn: "_Connection", loop: asyncio.AbstractEventLoop,
                 src: socket.socket, size: int, scan: Callable[[memoryview], None]) -> None:
        self.conn = conn
        self.loop = loop
        self.src = src
        self.dst: socket.socket | None = None
        self.size = size
        # Anonymous memory: pages become resident only once a read reaches them, so a
        # connection that never carries a large message stays small.
        self.buf = mmap.mmap(-1, size)
        self.view = memoryview(self.buf)
        self.tail = 0
        self.out: collections.deque = collections.deque()
        self.reading = False
        self.writing = False
        self.paused = False       # reading held off by the connection (routing)
        self.scan = scan
        self.closing = False      # no more reading; close dst once out is empty

    # -- reading -----------------------------------------------------------------

    def want_read(self) -> None:
        """Reads when there is room and nothing holds reading off."""
        want = (not self.paused and not self.closing
                and (not self.out or self.size - self.tail >= MIN_READ))
        if want and not self.reading:
            self.reading = True
            self.loop.add_reader(self.src.fileno(), self._on_readable)
        elif not want and self.reading:
            self.reading = False
            self.loop.remove_reader(self.src.fileno())

    def _on_readable(self) -> None:
        if not self.out:
            self.tail = 0
        # Drain what the socket holds (up to the buffer) before writing, so the
        # destination gets fewer, larger sends: fewer wakeups on both ends.
        for _ in range(READS_PER_WAKEUP):
            tail = self.tail
            room = self.size - tail
            try:
                n = self.src.recv_into(self.view[tail:])
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self.conn.lost(self, e)
                return
            if not n:
                self.conn.lost(self, None)
                return
            self.tail = tail + n
            try:
                self.scan(self.view[tail:tail + n])
            except Exception:  # noqa: BLE001 - a bug must not spin the loop on this socket
                log.exception("rendezvous: closing a connection after an internal error")
                self.conn.close()
                return
            if n < room and n < MIN_READ or self.size - self.tail < MIN_READ:
                break
        if self.out:
            self.flush()
        if self.out and self.size - self.tail < MIN_READ:
            self.want_read()

    # -- writing -----------------------------------------------------------------

    def send(self, chunks) -> None:
        """Queues ``chunks`` (bytes) after everything queued so far, and writes."""
        self.out.extend(chunks)
        self.flush()

    def flush(self) -> None:
        dst, out = self.dst, self.out
        if dst is None:
            return
        while out:
            try:
                if len(out) == 1:
                    n = dst.send(out[0])
                else:
                    n = dst.sendmsg(list(itertools.islice(out, 0, 64)))
            except (BlockingIOError, InterruptedError):
                break
            except OSError as e:
                self.conn.lost(self, e, writing=True)
                return
            while n:
                head = out[0]
                k = len(head)
                if n >= k:
                    out.popleft()
                    n -= k
                else:
                    out[0] = memoryview(head)[n:]
                    n = 0
            if out and len(out) < 64:
                break  # the socket took less than offered: wait until writable
        if out:
            if not self.writing:
                self.writing = True
                self.loop.add_writer(dst.fileno(), self.flush)
        else:
            self.tail = 0
            if self.writing:
                self.writing = False
                self.loop.remove_writer(dst.fileno())
            if self.closing:
                self.conn.drained(self)
                return
            if not self.reading:
                self.want_read()

    def stop(self) -> None:
        """No more reading or writing (the sockets are closed by the connection)."""
        if self.reading:
            self.reading = False
            self.loop.remove_reader(self.src.fileno())
        if self.writing and self.dst is not None:
            self.writing = False
            self.loop.remove_writer(self.dst.fileno())
        self.out.clear()
        self.closing = True


class _Connection:
    """One client connection and its upstream connection: two pipes.

    Client -> upstream: the frames are scanned to keep the HPACK decoder in step, find
    RecvTensor streams and hold their DATA frames until their turn, route the
    connection on its first request, and drop the client's ACK of our greeting;
    everything else streams through (large DATA payloads are never copied).
    Upstream -> client: everything is forwarded as it comes; frame headers are watched
    for the response HEADERS / DATA / RST_STREAM of RecvTensor streams with tickets.
    """

    def __init__(self, rv: "Rendezvous", sock: socket.socket) -> None:
        self.rv = rv
        self.loop = asyncio.get_running_loop()
        self.client = sock
        self.upstream: socket.socket | None = None
        self.c2u = _Pipe(self, self.loop, sock, REQUEST_BUFFER, self._scan_request)
        self.u2c: _Pipe | None = None
        self.closed = False
        # request scanner state
        self.preface = bytearray()
        self.hdr = bytearray()          # an incomplete frame header
        self.remaining = 0              # payload bytes of the current frame still to come
        self.mode = _PASS
        self.deferred: list[bytes] = []  # released mid-frame: sent once the frame ends
        self.frame = bytearray()        # the frame being collected (header + payload)
        self.frame_info: tuple[int, int, int, int] = (0, 0, 0, 0)
        self.drop_settings_ack = True   # the client's ACK of our greeting
        self.paths = RequestPaths()
        self.header_stream = 0
        self.header_block = bytearray()
        self.first_path = b""
        self.streams: dict[int, _Stream] = {}
        self.tickets: dict[int, _Stream] = {}
        self.routed = False
        # response watcher state
        self.rhdr = bytearray()
        self.skip = 0                   # payload bytes of the current response frame to come
        self.skip_stream: _Stream | None = None

    def start(self) -> None:
        self.rv.connections.add(self)
        try:
            self.client.send(EMPTY_SETTINGS)
        except OSError as e:
            self.lost(self.c2u, e)
            return
        self.c2u.want_read()

    # -- client -> upstream: the request scanner -----------------------------------

    def _scan_request(self, data: memoryview) -> None:
        out = self.c2u.out
        n = len(data)
        pos = run = 0
        if len(self.preface) < len(PREFACE):
            k = min(len(PREFACE) - len(self.preface), n)
            self.preface += data[:k]
            pos = run = k
            if len(self.preface) < len(PREFACE):
                return
            if self.preface != PREFACE:
                log.warning("not an HTTP/2 client; closing")
                self.close()
                return
            out.append(PREFACE)
        streams = self.streams
        while pos < n:
            if self.remaining:
                k = min(self.remaining, n - pos)
                mode = self.mode
                if mode == _COLLECT:
                    self.frame += data[pos:pos + k]
                pos += k
                self.remaining -= k
                if mode == _PASS and self.deferred and not self.remaining:
                    out.append(data[run:pos])  # the frame is through: now the releases
                    run = pos
                    out.extend(self.deferred)
                    self.deferred = []
                if mode != _PASS:
                    run = pos
                    if not self.remaining and mode == _COLLECT:
                        frame = bytes(self.frame)
                        self.frame = bytearray()
                        self._collected(frame, memoryview(frame)[9:], *self.frame_info)
                        if self.closed:
                            return
                continue
            # A frame header starts at pos (or continues one begun in an earlier read).
            if self.hdr or n - pos < 9:
                if run < pos:
                    out.append(data[run:pos])
                k = min(9 - len(self.hdr), n - pos)
                self.hdr += data[pos:pos + k]
                pos = run = pos + k
                if len(self.hdr) < 9:
                    break
                header = bytes(self.hdr)
                self.hdr.clear()
                length, ftype, flags, sid = _frame_header(header, 0)
                split = True
            else:
                length, ftype, flags, sid = _frame_header(data, pos)
                header = None
                split = False
            mode = _PASS
            if ftype == DATA:
                stream = streams.get(sid)
                if stream is not None and not stream.released:
                    mode = _COLLECT
            elif ftype == HEADERS or ftype == CONTINUATION:
                mode = _COLLECT
            elif ftype == SETTINGS and flags & ACK and self.drop_settings_ack:
                self.drop_settings_ack = False
                mode = _DROP
            elif ftype == RST_STREAM:
                self._reset(sid)
            if mode == _PASS:
                if split:
                    out.append(header)
                else:
                    pos += 9
                self.remaining = length
                self.mode = _PASS
                continue
            # A frame handled whole: flush the run before it.
            if not split:
                if run < pos:
                    out.append(data[run:pos])
                start = pos
                pos += 9
                if mode == _COLLECT and pos + length <= n:  # all here: no reassembly
                    end = pos + length
                    frame = data[start:end]
                    pos = run = end
                    self._collected(frame, data[start + 9:end], length, ftype, flags, sid)
                    if self.closed:
                        return
                    continue
                header = data[start:pos]
            run = pos
            self.mode = mode
            self.remaining = length
            if mode == _COLLECT:
                self.frame = bytearray(header)
                self.frame_info = (length, ftype, flags, sid)
                if not length:
                    self.frame = bytearray()
                    frame = bytes(header)
                    self._collected(frame, memoryview(frame)[9:], length, ftype, flags, sid)
                    if self.closed:
                        return
        if run < pos:
            out.append(data[run:pos])

    def _collected(self, frame, payload, length: int, ftype: int, flags: int,
                   sid: int) -> None:
        """A whole HEADERS / CONTINUATION frame, or DATA of a held stream (``frame`` is
        a view of the read buffer or bytes)."""
        out = self.c2u.out
        if ftype == DATA:
            stream = self.streams.get(sid)
            if stream is not None and not stream.released:
                self._hold(sid, stream, bytes(frame), flags, payload, out)
            else:  # released (or reset) while it was coming in
                out.append(frame)
            return
        out.append(frame)
        self._headers(ftype, flags, sid, payload)
        if not self.routed and self.header_stream == 0:
            self._route()

    def _reset(self, sid: int) -> None:
        stream = self.streams.pop(sid, None)
        if stream is not None and stream.ticket is not None and not stream.answered:
            stream.held.clear()
            stream.answered = True
            self.tickets.pop(sid, None)
            self.rv.gate.abandon(stream.ticket)

    def _headers(self, ftype: int, flags: int, sid: int, payload) -> None:
        if ftype == HEADERS:
            self.header_stream = sid
            self.header_block = bytearray()
        self.header_block += _header_block_fragment(ftype, flags, payload)
        if not flags & END_HEADERS:
            return
        block, self.header_stream = bytes(self.header_block), 0
        self.header_block = bytearray()
        try:
            path = self.paths.path(block)
        except HPACKError as e:  # keep forwarding; we just cannot gate this connection
            log.warning("cannot decode request headers (%s); not gating", e)
            self.rv.gate.totals["hpack_errors"] += 1
            return
        if not self.routed:
            self.first_path = path
        if path == RECV_TENSOR and self.rv.enforcing:
            self.streams[sid] = _Stream()

    def _hold(self, sid: int, stream: _Stream, frame: bytes, flags: int, payload,
              out) -> None:
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
            self.tickets[sid] = stream
            turn = self.rv.gate.request(ticket)
            if turn is None:
                self._release(sid, stream, out)
            else:
                turn.add_done_callback(lambda _f, s=sid, st=stream: self._release(s, st))
        elif flags & END_STREAM:
            self._release(sid, stream, out)

    def _release(self, sid: int, stream: _Stream, out=None) -> None:
        """Sends a held stream's DATA frames upstream: into ``out`` when called while
        scanning (so they follow everything scanned before them), else at once."""
        if stream.released:
            return
        stream.released = True
        held, stream.held = stream.held, []
        if stream.ticket is None:
            self.streams.pop(sid, None)  # not gated: nothing more to watch
        if out is not None:
            out.extend(held)
        elif held and not self.closed:
            if self.mode == _PASS and self.remaining:
                # ``out`` ends inside a frame being passed (a large DATA frame of
                # another stream read in pieces): the held frames go after it
                self.deferred.extend(held)
            else:
                self.c2u.send(held)

    # -- routing -----------------------------------------------------------------

    def _route(self) -> None:
        self.routed = True
        path = self.first_path
        target = (self.rv.control_address if path.startswith(CONTROL_PREFIX.encode())
                  else self.rv.upstream)
        self.c2u.paused = True
        self.loop.create_task(self._connect(target))

    async def _connect(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        host = host.strip("[]")
        try:
            sock = await _open(self.loop, host, int(port))
        except OSError as e:
            log.warning("cannot connect to %s: %s", target, e)
            self.rv.gate.totals["upstream_connect_errors"] += 1
            self.close()
            return
        if self.closed:
            sock.close()
            return
        self.upstream = sock
        self.c2u.dst = sock
        self.u2c = _Pipe(self, self.loop, sock, RESPONSE_BUFFER, self._watch_response)
        self.u2c.dst = self.client
        self.u2c.want_read()
        self.c2u.paused = False
        self.c2u.flush()
        if not self.closed:
            self.c2u.want_read()

    # -- upstream -> client: the response watcher ----------------------------------

    def _watch_response(self, data: memoryview) -> None:
        self.u2c.out.append(data)
        tickets = self.tickets
        n = len(data)
        pos = 0
        while pos < n:
            if self.skip:
                k = min(self.skip, n - pos)
                if self.skip_stream is not None:
                    self.skip_stream.ticket.nbytes += k
                self.skip -= k
                pos += k
                continue
            if self.rhdr or n - pos < 9:
                k = min(9 - len(self.rhdr), n - pos)
                self.rhdr += data[pos:pos + k]
                pos += k
                if len(self.rhdr) < 9:
                    break
                length, ftype, flags, sid = _frame_header(self.rhdr, 0)
                self.rhdr.clear()
            else:
                length, ftype, flags, sid = _frame_header(data, pos)
                pos += 9
            self.skip = length
            self.skip_stream = None
            if not tickets:
                continue
            stream = tickets.get(sid)
            if stream is None:
                continue
            if ftype == HEADERS:
                if not stream.answered:
                    stream.answered = True
                    self.rv.gate.handed_back(
                        stream.ticket, error="status" if flags & END_STREAM else "")
                elif flags & END_STREAM:  # the trailers: the response is complete
                    self.rv.gate.completed(stream.ticket)
                if flags & END_STREAM:
                    self._done(sid)
            elif ftype == DATA:
                self.skip_stream = stream
                if flags & END_STREAM:
                    self._done(sid)
            elif ftype == RST_STREAM:
                if not stream.answered:
                    stream.answered = True
                    self.rv.gate.handed_back(stream.ticket, error="reset")
                self._done(sid)

    def _done(self, sid: int) -> None:
        self.tickets.pop(sid, None)
        self.streams.pop(sid, None)

    # -- closing -----------------------------------------------------------------

    def lost(self, pipe: _Pipe, exc: Exception | None, writing: bool = False) -> None:
        """``pipe``'s source reached EOF or failed, or (``writing``) its destination
        failed: the connection closes. After an EOF, what is queued in either direction
        still goes out first (as asyncio's transports did); after an error, what was
        queued toward the failed socket is dropped."""
        if self.closed:
            self.drained(pipe)
            return
        gone = pipe.dst if writing else pipe.src
        self._finish_tickets(upstream_gone=gone is not None and gone is self.upstream)
        self.closed = True
        self.rv.connections.discard(self)
        pipes = [p for p in (self.c2u, self.u2c) if p is not None]
        for p in pipes:
            if p.reading:
                p.reading = False
                self.loop.remove_reader(p.src.fileno())
            p.closing = p.paused = True
            if exc is not None and p.dst is gone:
                p.stop()
        for p in pipes:
            if not p.out or p.dst is None:
                self.drained(p)
            else:
                p.flush()

    def drained(self, pipe: _Pipe) -> None:
        """A closing pipe has sent everything (or gave up): once both have, both
        sockets close."""
        pipe.stop()
        if all(not p.out for p in (self.c2u, self.u2c) if p is not None):
            self._close_now()

    def _finish_tickets(self, upstream_gone: bool) -> None:
        for stream in list(self.tickets.values()) + list(self.streams.values()):
            if stream.ticket is not None and not stream.answered:
                stream.answered = True
                if upstream_gone:
                    self.rv.gate.handed_back(stream.ticket, error="upstream closed")
                else:
                    self.rv.gate.abandon(stream.ticket)
        self.tickets.clear()
        self.streams.clear()

    def close(self) -> None:
        """Closes both sides now (a bad client, an unreachable upstream, stop())."""
        if not self.closed:
            self._finish_tickets(upstream_gone=False)
            self.closed = True
            self.rv.connections.discard(self)
        self._close_now()

    def _close_now(self) -> None:
        for p in (self.c2u, self.u2c):
            if p is not None:
                p.stop()
        for sock in (self.client, self.upstream):
            if sock is not None and sock.fileno() >= 0:
                sock.close()


async def _open(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket to ``host:port`` (numeric hosts resolve
    without a thread)."""
    try:
        infos = [(socket.AF_INET6 if ":" in host else socket.AF_INET, (host, port))]
        socket.inet_pton(infos[0][0], host)
    except OSError:
        infos = [(family, addr) for family, _, _, _, addr in
                 await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
    error: OSError | None = None
    for family, addr in infos:
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, addr)
        except OSError as e:
            sock.close()
            error = e
            continue
        except BaseException:
            sock.close()
            raise
        _set_nodelay(sock)
        return sock
    raise error or OSError(f"no address for {host}")


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

    def arrive(self, message: bytes) -> Ticket | None:
        """A complete RecvTensorRequest message: registers it with the gate."""
        try:
            step_id, key = self._parse(message)
        except Exception:  # noqa: BLE001 - not ours to judge; forward it untouched
            self.gate.totals["unparsed"] += 1
            return None
        name, dest, tensor = parse_rendezvous_key(key)
        return self.gate.arrive(step_id, dest, name, tensor)

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
                    self.gate.skip_after_s = checks.seconds("skip_after_s", skip_after_s)
                window_bytes = args.get("window_bytes")
                if window_bytes is not None:
                    self.gate.window_bytes = check_window(window_bytes)
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


def _listen(host: str | None, port: int) -> list[socket.socket]:
    """Listening non-blocking sockets on every address of ``host`` (all interfaces
    when None), like ``loop.create_server(reuse_address=True)``."""
    socks: list[socket.socket] = []
    seen = set()
    try:
        for family, type_, proto, _, addr in socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
            if (family, addr) in seen:
                continue
            seen.add((family, addr))
            sock = socket.socket(family, type_, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(addr)
            sock.listen(128)
            sock.setblocking(False)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    if not socks:
        raise OSError(f"no address to listen on for {host!r}")
    return socks


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
