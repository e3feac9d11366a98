"""HTTP/2 as the proxy reads it: the constants, the frame-header helpers and the HPACK
decoding of request header blocks (with its cache).

Only what the interposer needs to find ``/tensorflow.WorkerService/RecvTensor``
streams: frame headers are read in place, and request header blocks are decoded in
order so the HPACK decoder's dynamic table stays in step with the client's encoder.
Nothing is ever re-encoded. No sockets, no event loop here.
"""

from __future__ import annotations

import struct

from hpack import Decoder

RECV_TENSOR = b"/tensorflow.WorkerService/RecvTensor"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, \
    WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
_HEADER = struct.Struct(">I B I")  # (length << 8 | type) split below, flags, stream


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
    Decoding every block in pure Python was a large share of the proxy's CPU time
    (measured: benchmarks/RESULTS.md).
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
