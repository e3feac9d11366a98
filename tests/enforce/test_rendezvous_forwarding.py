"""The rendezvous's frame-level forwarding on its own, with a scripted HTTP/2 client and a
scripted upstream (no TensorFlow): bytes unchanged and in order per direction, frames
split across reads at any point, large frames and backpressure, RecvTensor request DATA
held until its turn, hand-back on the response HEADERS, resets and closes."""

from __future__ import annotations

import hashlib
import json
import random
import socket
import struct
import threading
import time

import pytest
from hpack import Encoder

from tictac_hooks.enforce.client import RendezvousClient
from tictac_hooks.enforce.gate import Gate
from tictac_hooks.graph.tf.naming import worker_of
from tictac_hooks.enforce.proxy import (EMPTY_SETTINGS, PREFACE, RECV_TENSOR, Rendezvous,
                                        RendezvousThread)
from tictac_hooks.graph.schedule import Schedule

DATA, HEADERS, RST_STREAM, SETTINGS, PING, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
DEST = "/job:worker/replica:0/task:0/device:CPU:0"
SETTINGS_ACK = struct.pack(">IBI", SETTINGS << 0, ACK, 0)  # length 0, type 4


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">IBI", (len(payload) << 8) | ftype, flags, sid) + payload


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while pos + 9 <= len(data):
        word, flags, sid = struct.unpack_from(">IBI", data, pos)
        length = word >> 8
        out.append((word & 0xFF, flags, sid & 0x7FFFFFFF, data[pos + 9:pos + 9 + length]))
        pos += 9 + length
    assert pos == len(data), "trailing partial frame"
    return out


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + len(body).to_bytes(4, "big") + body


def recv_request(step: int, name: str) -> bytes:
    key = f"/job:ps/replica:0/task:0/device:CPU:0;1;{DEST};edge_1_{name};0:0"
    return grpc_message(f"{step}|{key}".encode())


def parse_request(message: bytes) -> tuple[int, str]:
    step, key = message.split(b"|", 1)
    return int(step), key.decode()


class Client:
    """One HTTP/2 client connection (raw bytes) with its own HPACK encoder."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.enc = Encoder()
        self.peer = Peer(self.sock)

    def headers(self, sid: int, path: bytes, end_stream: bool = False) -> bytes:
        block = self.enc.encode([(b":method", b"POST"), (b":scheme", b"http"),
                                 (b":path", path), (b":authority", b"ps"),
                                 (b"content-type", b"application/grpc"), (b"te", b"trailers")])
        return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), sid, block)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)


class Peer:
    """Collects everything a socket receives, in a thread."""

    def __init__(self, sock: socket.socket, read_delay: float = 0.0) -> None:
        self.sock = sock
        self.data = bytearray()
        self.eof = False
        self.read_delay = read_delay
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    break
                with self.cond:
                    self.data += chunk
                    self.cond.notify_all()
                if self.read_delay:
                    time.sleep(self.read_delay)
        except OSError:
            pass
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def wait(self, predicate, timeout: float = 10.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: predicate(self), timeout)

    def wait_len(self, n: int, timeout: float = 20.0) -> bytes:
        assert self.wait(lambda p: len(p.data) >= n or p.eof, timeout), \
            f"got {len(self.data)} of {n} bytes"
        return bytes(self.data)


class Upstream:
    """A scripted 'TensorFlow server': accepts connections, records what it receives."""

    def __init__(self, read_delay: float = 0.0) -> None:
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.lsock.getsockname()[1]}"
        self.conns: list[Peer] = []
        self.cond = threading.Condition()
        self.read_delay = read_delay
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.lsock.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.cond:
                self.conns.append(Peer(sock, self.read_delay))
                self.cond.notify_all()

    def conn(self, i: int = 0, timeout: float = 10.0) -> Peer:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.conns) > i, timeout), "no connection"
            return self.conns[i]

    def close(self) -> None:
        self.lsock.close()
        for p in self.conns:
            try:
                p.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            p.sock.close()


@pytest.fixture
def upstream():
    up = Upstream()
    yield up
    up.close()


def start(upstream_address: str, gate: Gate | None = None) -> RendezvousThread:
    return RendezvousThread(Rendezvous("127.0.0.1:0", upstream_address, gate=gate,
                                       request_parser=parse_request)).start()


def send_in_pieces(sock: socket.socket, data: bytes, rng: random.Random,
                   max_piece: int = 9000) -> None:
    pos = 0
    while pos < len(data):
        # tiny pieces for the frame headers near the start, bigger ones later
        n = rng.randint(1, max_piece if pos < 1 << 16 else max(max_piece, 1 << 16))
        sock.sendall(data[pos:pos + n])
        pos += n
        if rng.random() < 0.3:
            time.sleep(0.0005)


def client_script(c: Client, big: int) -> tuple[bytes, bytes]:
    """(everything the client sends, what the PS must receive: all but the ACK of the
    rendezvous's greeting)."""
    h1 = c.headers(1, RECV_TENSOR)  # in wire order: HPACK state
    h3 = c.headers(3, b"/tensorflow.WorkerService/RunGraph")
    h5 = c.headers(5, RECV_TENSOR)
    parts = [
        PREFACE, frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 1 << 22)),
        frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 24)),
        SETTINGS_ACK,  # the ACK of the rendezvous's own greeting: dropped
        h1, frame(DATA, END_STREAM, 1, recv_request(5, "a")),
        # a header block split over HEADERS + CONTINUATION, with padding and priority
        frame(HEADERS, PADDED | PRIORITY, 3,
              b"\x03" + b"\x00\x00\x00\x00\x10" + h3[9:20] + b"\x00\x00\x00"),
        frame(CONTINUATION, END_HEADERS, 3, h3[20:]),
        frame(DATA, 0, 3, bytes(range(256)) * (big // 256)),
        frame(PING, 0, 0, b"12345678"),
        frame(DATA, PADDED, 3, b"\x02" + b"xyz" + b"\x00\x00"),
        frame(DATA, END_STREAM, 3, b"end"),
        h5,
        # a request message split over two DATA frames, the first padded
        frame(DATA, PADDED, 5, b"\x04" + recv_request(5, "b")[:7] + b"\x00" * 4),
        frame(DATA, END_STREAM, 5, recv_request(5, "b")[7:]),
        SETTINGS_ACK,  # a later ACK (of the PS's SETTINGS) is forwarded
    ]
    return b"".join(parts), b"".join(parts[:3] + parts[4:])


def upstream_script(big: int) -> bytes:
    enc = Encoder()
    status = enc.encode([(b":status", b"200"), (b"content-type", b"application/grpc")])
    trailers = enc.encode([(b"grpc-status", b"0")])
    payload = (bytes(random.Random(7).getrandbits(8) for _ in range(4096)) * (big // 4096 + 1))[:big]
    return b"".join([
        frame(SETTINGS, 0, 0), SETTINGS_ACK,
        frame(HEADERS, END_HEADERS, 1, status),
        frame(DATA, 0, 1, payload[:big // 2]), frame(DATA, 0, 1, payload[big // 2:]),
        frame(HEADERS, END_HEADERS | END_STREAM, 1, trailers),
        frame(WINDOW_UPDATE, 0, 3, struct.pack(">I", 1 << 20)),
        frame(HEADERS, END_HEADERS, 3, status),
        frame(DATA, PADDED, 3, b"\x01" + b"ok" + b"\x00"),
        frame(HEADERS, END_HEADERS | END_STREAM, 3, trailers),
        frame(HEADERS, END_HEADERS, 5, status), frame(DATA, END_STREAM, 5, b"tensor"),
        frame(HEADERS, END_HEADERS | END_STREAM, 5, trailers),
    ])


@pytest.mark.parametrize("seed,big", [(0, 1 << 10), (1, 3 << 20), (2, 9 << 20)])
def test_bytes_reach_both_ends_unchanged_and_in_order(upstream, seed, big):
    rng = random.Random(seed)
    rv = start(upstream.address)
    try:
        c = Client(rv.address)
        sent, expected_up = client_script(c, big)
        send_in_pieces(c.sock, sent, rng, max_piece=rng.choice([7, 9000, 1 << 20]))
        up = upstream.conn()
        got = up.wait_len(len(expected_up))
        assert len(got) == len(expected_up) and got == expected_up
        reply = upstream_script(big)
        send_in_pieces(up.sock, reply, rng, max_piece=rng.choice([5, 20000, 1 << 21]))
        got = c.peer.wait_len(len(EMPTY_SETTINGS) + len(reply))
        assert got == EMPTY_SETTINGS + reply
        stats = rv.call(lambda: rv.rendezvous.stats())
        [rec] = stats.steps
        assert rec.step_id == 5 and rec.worker == worker_of(DEST)  # one worker is one task
        assert sorted(rec.order) == ["a", "b"]
        by_name = {t.name: t for t in rec.transfers}
        assert by_name["a"].bytes == big and by_name["b"].bytes == len(b"tensor")
        assert stats.totals == {"pass": 2}
    finally:
        rv.stop()


def test_many_megabytes_with_a_slow_reader_both_ways(upstream):
    """Backpressure: a slow client and a slow PS; every byte arrives, in order."""
    slow = Upstream(read_delay=0.002)
    rv = start(slow.address)
    try:
        c = Client(rv.address)
        c.peer.read_delay = 0.002
        h1 = c.headers(1, b"/tensorflow.WorkerService/RunGraph")
        c.send(PREFACE + frame(SETTINGS, 0, 0) + SETTINGS_ACK + h1)
        up = slow.conn()
        rng = random.Random(3)
        block = bytes(rng.getrandbits(8) for _ in range(1 << 16))
        body = b"".join(frame(DATA, 0, 1, block * rng.randint(1, 64)) for _ in range(12))
        reply = b"".join(frame(DATA, 0, 1, block * rng.randint(1, 64)) for _ in range(12))
        t = threading.Thread(target=up.sock.sendall, args=(reply,), daemon=True)
        t.start()
        c.send(body)
        expected_up = PREFACE + frame(SETTINGS, 0, 0) + h1 + body
        got_up = up.wait_len(len(expected_up), timeout=60)
        got_client = c.peer.wait_len(len(EMPTY_SETTINGS) + len(reply), timeout=60)
        assert hashlib.sha256(got_up).digest() == hashlib.sha256(expected_up).digest()
        assert got_client == EMPTY_SETTINGS + reply
        t.join(10)
    finally:
        rv.stop()
        slow.close()


def _h(frames_list, ftype, sid):
    return [f for f in frames_list if f[0] == ftype and f[2] == sid]


def test_recv_tensor_data_waits_for_its_turn_and_headers_never_wait(upstream):
    gate = Gate(skip_after_s=5.0)
    gate.install(Schedule.from_order("test", ["a", "b"]))
    rv = start(upstream.address, gate)
    try:
        c = Client(rv.address)
        c.send(PREFACE + frame(SETTINGS, 0, 0) + SETTINGS_ACK +
               c.headers(1, RECV_TENSOR) + frame(DATA, END_STREAM, 1, recv_request(9, "b")))
        up = upstream.conn()
        up.wait(lambda p: len(_h(frames(bytes(p.data[len(PREFACE):])), HEADERS, 1)) == 1)
        c.send(c.headers(3, RECV_TENSOR) + frame(DATA, END_STREAM, 3, recv_request(9, "a")))
        assert up.wait(lambda p: _h(frames(bytes(p.data[len(PREFACE):])), DATA, 3))
        time.sleep(0.2)
        got = frames(bytes(up.data[len(PREFACE):]))
        assert [f[2] for f in got if f[0] in (HEADERS, DATA)] == [1, 3, 3], got
        # The PS answers a: its HEADERS hand it back, and b's request goes on.
        status = Encoder().encode([(b":status", b"200")])
        up.sock.sendall(frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 3, status))
        assert up.wait(lambda p: _h(frames(bytes(p.data[len(PREFACE):])), DATA, 1))
        got = frames(bytes(up.data[len(PREFACE):]))
        assert [f[2] for f in got if f[0] in (HEADERS, DATA)] == [1, 3, 3, 1]
        assert _h(got, DATA, 1)[0][3] == recv_request(9, "b")
        up.sock.sendall(frame(HEADERS, END_HEADERS | END_STREAM, 1, status))

        def rec():
            return rv.rendezvous.stats().steps[0].to_json()
        deadline = time.time() + 5
        while rv.call(rec)["order"] != ["a", "b"] and time.time() < deadline:
            time.sleep(0.01)
        r = rv.call(rec)
        assert r["order"] == ["a", "b"] and r["skips"] == 0 and r["complete"]
    finally:
        rv.stop()


def test_a_reset_request_is_abandoned_and_a_closed_ps_hands_back_with_an_error(upstream):
    gate = Gate(skip_after_s=5.0)
    gate.install(Schedule.from_order("test", ["a", "b", "c"]))
    rv = start(upstream.address, gate)
    try:
        c = Client(rv.address)
        c.send(PREFACE + frame(SETTINGS, 0, 0) + SETTINGS_ACK +
               c.headers(1, RECV_TENSOR) + frame(DATA, END_STREAM, 1, recv_request(4, "c")) +
               c.headers(3, RECV_TENSOR) + frame(DATA, END_STREAM, 3, recv_request(4, "b")))
        up = upstream.conn()
        up.wait(lambda p: len(_h(frames(bytes(p.data[len(PREFACE):])), HEADERS, 3)) == 1)
        time.sleep(0.1)
        assert not _h(frames(bytes(up.data[len(PREFACE):])), DATA, 3)
        # b and c wait for a; the client gives up on c, which counts as c's turn (a
        # skip), so b goes.
        c.send(frame(RST_STREAM, 0, 1, b"\x00\x00\x00\x08"))
        assert up.wait(lambda p: _h(frames(bytes(p.data[len(PREFACE):])), RST_STREAM, 1))
        assert up.wait(lambda p: _h(frames(bytes(p.data[len(PREFACE):])), DATA, 3))
        c.send(c.headers(5, RECV_TENSOR) + frame(DATA, END_STREAM, 5, recv_request(4, "a")))
        assert up.wait(lambda p: _h(frames(bytes(p.data[len(PREFACE):])), DATA, 5))
        status = Encoder().encode([(b":status", b"200")])
        up.sock.sendall(frame(HEADERS, END_HEADERS, 5, status))
        # c's DATA never goes.
        time.sleep(0.1)
        assert not _h(frames(bytes(up.data[len(PREFACE):])), DATA, 1)
        # The PS goes away with b in flight: b is handed back with an error, the client
        # connection is closed.
        up.sock.shutdown(socket.SHUT_RDWR)
        assert c.peer.wait(lambda p: p.eof)

        def rec():
            return rv.rendezvous.stats().steps[0].to_json()
        deadline = time.time() + 5
        while len(rv.call(rec)["order"]) < 2 and time.time() < deadline:
            time.sleep(0.01)
        r = rv.call(rec)
        assert r["order"] == ["a", "b"]
        assert r["transfers"][1]["error"] == "upstream closed"
        assert [s["reason"] for s in r["skipped"]] == ["cancelled"]
    finally:
        rv.stop()


def test_control_calls_are_routed_to_the_control_service(upstream):
    rv = start(upstream.address)
    try:
        with RendezvousClient(rv.address, timeout_s=10) as client:
            assert client.ping() and client.stats().upstream == upstream.address
        time.sleep(0.1)
        assert not upstream.conns
    finally:
        rv.stop()


def test_unreachable_upstream_and_non_http2_clients_are_closed():
    s = socket.create_server(("127.0.0.1", 0))
    dead = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    rv = start(dead)
    try:
        c = Client(rv.address)
        c.send(PREFACE + frame(SETTINGS, 0, 0) + c.headers(1, RECV_TENSOR))
        assert c.peer.wait(lambda p: p.eof)
        assert rv.call(lambda: rv.rendezvous.gate.totals["upstream_connect_errors"]) == 1
        c2 = Client(rv.address)
        c2.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c2.peer.wait(lambda p: p.eof)
        assert bytes(c2.peer.data) == EMPTY_SETTINGS
    finally:
        rv.stop()


def test_listen_error_is_clear():
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    try:
        with pytest.raises(OSError, match="cannot listen on"):
            RendezvousThread(Rendezvous(f"127.0.0.1:{port}", "127.0.0.1:1",
                                        request_parser=parse_request)).start()
    finally:
        s.close()


def test_a_client_that_goes_away_abandons_its_held_requests(upstream):
    gate = Gate(skip_after_s=5.0)
    gate.install(Schedule.from_order("test", ["a", "b"]))
    rv = start(upstream.address, gate)
    try:
        c = Client(rv.address)
        c.send(PREFACE + frame(SETTINGS, 0, 0) + SETTINGS_ACK +
               c.headers(1, RECV_TENSOR) + frame(DATA, END_STREAM, 1, recv_request(2, "b")))
        up = upstream.conn()
        assert up.wait(lambda p: _h(frames(bytes(p.data[len(PREFACE):])), HEADERS, 1))
        c.sock.shutdown(socket.SHUT_RDWR)
        c.sock.close()
        assert up.wait(lambda p: p.eof), "the upstream connection stays open"
        assert not _h(frames(bytes(up.data[len(PREFACE):])), DATA, 1)
        assert rv.call(lambda: len(rv.rendezvous.connections)) == 0
        rec = rv.call(lambda: rv.rendezvous.stats().steps[0].to_json())
        assert rec["order"] == [] and [s["reason"] for s in rec["skipped"]] == ["cancelled"]
    finally:
        rv.stop()


def _complete_frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """The complete frames at the start of ``data`` (a partial last one left out)."""
    out, pos = [], 0
    while pos + 9 <= len(data):
        word, flags, sid = struct.unpack_from(">IBI", data, pos)
        if pos + 9 + (word >> 8) > len(data):
            break
        out.append((word & 0xFF, flags, sid & 0x7FFFFFFF, data[pos + 9:pos + 9 + (word >> 8)]))
        pos += 9 + (word >> 8)
    return out


def test_a_release_never_lands_inside_another_streams_frame(upstream):
    """A held RecvTensor request released while a large DATA frame of another stream is
    half through goes upstream after that frame, not inside it."""
    gate = Gate(skip_after_s=5.0)
    gate.install(Schedule.from_order("test", ["a", "b"]))
    rv = start(upstream.address, gate)
    try:
        c = Client(rv.address)
        big = frame(DATA, END_STREAM, 5, bytes(range(256)) * ((4 << 20) // 256))
        first = (PREFACE + frame(SETTINGS, 0, 0) + SETTINGS_ACK +
                 c.headers(1, RECV_TENSOR) + frame(DATA, END_STREAM, 1, recv_request(3, "b")) +
                 c.headers(3, RECV_TENSOR) + frame(DATA, END_STREAM, 3, recv_request(3, "a")) +
                 c.headers(5, b"/tensorflow.WorkerService/RunGraph") + big[:1 << 20])
        c.send(first)
        up = upstream.conn()
        assert up.wait(lambda p: len(p.data) > 1 << 19)
        time.sleep(0.05)
        # a is answered: b's request is released while stream 5's frame is half-way
        status = Encoder().encode([(b":status", b"200")])
        up.sock.sendall(frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 3, status))
        assert up.wait(lambda p: not _h(_complete_frames(bytes(p.data[len(PREFACE):])),
                                        DATA, 1) and _h(_complete_frames(
                                            bytes(p.data[len(PREFACE):])), DATA, 3))
        time.sleep(0.2)
        c.send(big[1 << 20:])
        up.wait_len(len(first) - len(SETTINGS_ACK) + len(big) - (1 << 20), timeout=30)
        got = frames(bytes(up.data[len(PREFACE):]))
        order = [(f[0], f[2]) for f in got if f[0] in (HEADERS, DATA)]
        assert order == [(HEADERS, 1), (HEADERS, 3), (DATA, 3), (HEADERS, 5), (DATA, 5),
                         (DATA, 1)], order
        assert _h(got, DATA, 5)[0][3] == big[9:]
        assert _h(got, DATA, 1)[0][3] == recv_request(3, "b")
    finally:
        rv.stop()


def test_request_paths_cache_follows_the_hpack_table():
    """Indexed-only header blocks are cached, but a block that changes the table (a new
    literal shifts the dynamic entries) invalidates them: the same bytes may then mean
    another path."""
    from tictac_hooks.enforce.proxy.h2 import RequestPaths, _only_indexed

    enc, paths = Encoder(), RequestPaths()
    first = enc.encode([(":method", "POST"), (":path", "/a")])
    assert not _only_indexed(first) and paths.path(first) == b"/a"
    again = enc.encode([(":method", "POST"), (":path", "/a")])
    assert _only_indexed(again) and paths.path(again) == b"/a"
    assert paths.cache == {again: b"/a"} and paths.path(again) == b"/a"
    new = enc.encode([(":method", "POST"), (":path", "/b")])  # inserts /b at index 62
    assert paths.path(new) == b"/b" and paths.cache == {}
    same_bytes = enc.encode([(":method", "POST"), (":path", "/b")])
    assert same_bytes == again  # index 62 now names /b
    assert paths.path(same_bytes) == b"/b"
    # a multi-byte index (>= 127) is still "indexed only"
    assert _only_indexed(bytes([0xFF, 0x81, 0x01])) and not _only_indexed(bytes([0xFF, 0x01, 0x40]))


# -- large schedules (issue #14.6) -------------------------------------------------------

def big_schedule(n: int = 100_000, name_chars: int = 60) -> Schedule:
    prefix = "model/block_x/layer_y/kernel/ReadVariableOp/"
    names = [(prefix + "x" * name_chars)[:name_chars - 6] + f"{i:06d}" for i in range(n)]
    return Schedule.from_order("tic", names)


def test_a_schedule_over_grpcs_default_4_mib_installs_on_the_proxy(upstream):
    """100,000 transfers with 60-character names: 13 MiB of JSON, once RESOURCE_EXHAUSTED
    ("cannot reach ... is the PS running?")."""
    schedule = big_schedule()
    assert len(json.dumps({"schedule": schedule.to_json()})) > 4 << 20
    rv = start(upstream.address)
    try:
        with RendezvousClient(rv.address, timeout_s=60) as client:
            result = client.install(schedule)
        assert result.transfers == 100_000 and result.expected == 100_000
    finally:
        rv.stop()


def test_a_schedule_over_the_install_limit_is_refused_before_it_is_sent(monkeypatch):
    from tictac_hooks.enforce import api
    from tictac_hooks.graph.schedule import ScheduleError
    monkeypatch.setattr(api, "MAX_INSTALL_BYTES", 1 << 20)
    s = socket.create_server(("127.0.0.1", 0))
    nobody = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nothing listens: a request sent would fail with "cannot reach"
    with RendezvousClient(nobody, timeout_s=5) as client:
        with pytest.raises(ScheduleError, match=(
                rf"the schedule for {nobody} is too large to install: 20000 transfers "
                r"encode to 2\.\d MiB, over the limit of 1 MiB per install")):
            client.install(big_schedule(20_000))
