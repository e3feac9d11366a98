"""One proxied connection: the client's socket, the upstream socket, a :class:`_Pipe`
each way, the routing of the connection, and the response watcher.

Client -> upstream is the request scanner (:mod:`tictac_hooks.enforce.proxy.scanner`,
a base of :class:`_Connection`), which holds RecvTensor request DATA until its turn.
Upstream -> client is forwarded as it comes; the response watcher only reads frame
headers, for the response HEADERS / DATA / RST_STREAM of RecvTensor streams with
tickets: the counter of the transfer's (step, destination) advances when the PS's
response HEADERS come back, i.e. when the PS handed the response to gRPC.

Routing: gRPC clients wait for the server's SETTINGS before they send a request, so
the connection greets the client with an empty SETTINGS frame (and the scanner later
drops the client's ACK of it), reads the first request's path, and connects the whole
connection to where the Rendezvous routes that path: the TensorFlow server or, for
``/tictac.Rendezvous/*``, the control service. Reading from the client pauses until
the upstream connection is made.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from tictac_hooks.enforce.proxy.h2 import (DATA, EMPTY_SETTINGS, END_STREAM, HEADERS,
                                           RST_STREAM, _frame_header)
from tictac_hooks.enforce.proxy.pipes import REQUEST_BUFFER, RESPONSE_BUFFER, _open, _Pipe
from tictac_hooks.enforce.proxy.scanner import RequestScanner, _Stream
from tictac_hooks.graph.tf.naming import is_dead_response

log = logging.getLogger(__name__)


class _Connection(RequestScanner):
    """One client connection and its upstream connection: two pipes.

    Client -> upstream: the frames are scanned to keep the HPACK decoder in step, find
    RecvTensor streams and hold their DATA frames until their turn, route the
    connection on its first request, and drop the client's ACK of our greeting;
    everything else streams through (large DATA payloads are never copied).
    Upstream -> client: everything is forwarded as it comes; frame headers are watched
    for the response HEADERS / DATA / RST_STREAM of RecvTensor streams with tickets.

    ``rv`` is the :class:`~tictac_hooks.enforce.proxy.Rendezvous` that accepted it.
    """

    def __init__(self, rv: Any, sock: socket.socket) -> None:
        self.rv = rv
        self.loop = asyncio.get_running_loop()
        self.client = sock
        self.upstream: socket.socket | None = None
        self.c2u = _Pipe(self, self.loop, sock, REQUEST_BUFFER, self._scan_request)
        self.u2c: _Pipe | None = None
        self.closed = False
        super().__init__()  # request scanner state
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

    # -- routing -----------------------------------------------------------------

    def _route(self) -> None:
        self.routed = True
        target = self.rv.route(self.first_path)
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
                # A dead tensor's response (a loop's exit iteration) is one tiny gRPC
                # message: 5 bytes of framing, then the RecvTensorResponse.
                if stream.ticket.nbytes == 0 and length <= 64 and pos + length <= n:
                    stream.ticket.dead = is_dead_response(data[pos + 5:pos + length])
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
