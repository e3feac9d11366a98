"""The request scanner: the client -> upstream direction of a connection, frame by
frame, with the holding of RecvTensor request DATA.

Every frame the client sends reaches the TensorFlow server unchanged and in order; the
scanner reads frame headers in place and decodes request header blocks (HPACK, to keep
the decoder's table in step) to find ``/tensorflow.WorkerService/RecvTensor`` streams.
Of those it holds back the request's DATA frames until the
:class:`~tictac_hooks.enforce.gate.Gate` says it is the transfer's turn. HEADERS are
never held: HPACK depends on their order (the server's decoder must see the header
blocks in the order the client's encoder wrote them), while holding the DATA delays
just the request message, and with it the PS's answer. Released frames go out after
everything scanned before them (a release in the middle of a frame being passed waits
until that frame ends). No thread waits per transfer: the gate's future releases them.

The scanner also drops the client's ACK of the connection's own greeting SETTINGS and
calls the connection's routing once the first request's header block is complete.
"""

from __future__ import annotations

import logging

from hpack.exceptions import HPACKError

from tictac_hooks.enforce.gate import Ticket
from tictac_hooks.enforce.proxy.h2 import (ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM,
                                           HEADERS, PREFACE, RECV_TENSOR, RST_STREAM,
                                           SETTINGS, RequestPaths, _data_payload,
                                           _frame_header, _header_block_fragment)

log = logging.getLogger(__name__)

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


class RequestScanner:
    """The client -> upstream half of a connection (a base of ``_Connection``).

    ``_scan_request`` is the ``scan`` of the connection's client -> upstream pipe. It
    uses the connection's ``rv`` (the Rendezvous: ``gate``, ``enforcing``,
    ``arrive``), ``c2u`` (that pipe), ``closed``, ``close()``, ``routed`` and
    ``_route()``; the ``streams`` and ``tickets`` it fills are shared with the
    connection's response watcher.
    """

    def __init__(self) -> None:
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
