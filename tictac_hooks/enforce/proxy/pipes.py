"""The socket pumps of the proxy: :class:`_Pipe` (one direction of a connection) and
the socket helpers (connect, listen, ``TCP_NODELAY``).

Each direction is a :class:`_Pipe`, non-blocking sockets driven by the event loop's
``add_reader``/``add_writer`` (no asyncio transports): ``recv_into`` one preallocated
buffer, scan the frame headers in place, ``send``/``sendmsg`` views of that buffer.
Payload bytes are never copied in user space (only HPACK header blocks and held
RecvTensor request frames, both small, are); when a destination is slow the pipe stops
reading, so backpressure goes to the sender's TCP window and HTTP/2 flow control rather
than into a queue. What is left is the kernel's two extra socket copies per byte.
(Splicing large DATA payloads socket -> kernel pipe -> socket instead was tried and
left out: it saved the PS little CPU and made the worker's copies dearer, because the
receiver then copies pages the sender wrote long before, no longer in cache; measured:
benchmarks/RESULTS.md. ``benchmarks/bench_rendezvous.py --only floor`` measures what
one extra copying hop costs with no proxy logic at all.)

A pipe knows nothing of HTTP/2: what it reads goes to its ``scan`` callback, and it
reports EOF, errors and drained output to its owner (:class:`_PipeOwner`, in practice
the connection).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import mmap
import socket
from typing import Callable, Protocol

log = logging.getLogger(__name__)

RESPONSE_BUFFER = 4 << 20  # per connection, upstream -> client (tensors)
REQUEST_BUFFER = 256 << 10  # per connection, client -> upstream (requests)
MIN_READ = 64 << 10        # least room worth a read while output is pending
READS_PER_WAKEUP = 16


class _PipeOwner(Protocol):
    """What a :class:`_Pipe` calls back (the connection it belongs to)."""

    def lost(self, pipe: _Pipe, exc: Exception | None, writing: bool = False) -> None: ...

    def drained(self, pipe: _Pipe) -> None: ...

    def close(self) -> None: ...


def _set_nodelay(sock: socket.socket) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


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

    def __init__(self, conn: _PipeOwner, loop: asyncio.AbstractEventLoop,
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
