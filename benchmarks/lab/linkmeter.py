"""Link meters over a shaped test network: what a link really carries.

``bulk_transfer`` (goodput and wire rate of one TCP stream), ``tcp_rtt`` (round trips of
1-byte echoes) and ``egress_bytes`` (bytes through a host's token bucket, from ``tc -s``),
each over a :class:`~tictac_hooks.cluster.netns.ShapedNetwork`. The benchmarks use them
to check the shaped rate they compare against; the network's own tests use them to check
the shaping.

Example:
  with ShapedNetwork(["ps0", "worker0"], rate="1gbit") as net:
      print(bulk_transfer(net, "ps0", "worker0", 64 << 20))
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
from typing import Callable, Iterator

from tictac_hooks.cluster.netns import NetworkError, ShapedNetwork, call_in_netns


def egress_bytes(net: ShapedNetwork, host: str) -> int:
    """Bytes the host's egress token bucket has sent (``tc -s``)."""
    out = subprocess.run(["tc", "-j", "-s", "-n", net.namespace(host), "qdisc", "show",
                          "dev", "eth0"], check=True, capture_output=True, text=True,
                         timeout=20).stdout
    return sum(int(q.get("bytes", 0)) for q in json.loads(out) if q.get("kind") == "tbf")


@contextlib.contextmanager
def _serving(net: ShapedNetwork, host: str, serve: Callable[[socket.socket], None],
             timeout_s: float) -> Iterator[int]:
    """Accepts one TCP connection on ``host`` and hands it to ``serve`` in a thread
    there; yields the port, and joins the thread (bounded) on exit."""
    with net.listener(host) as (server, port):
        server.settimeout(timeout_s)

        def accept_and_serve() -> None:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(timeout_s)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                serve(conn)

        thread = threading.Thread(target=lambda: call_in_netns(
            net.namespace(host), accept_and_serve, timeout_s * 2), daemon=True)
        thread.start()
        try:
            yield port
        finally:
            thread.join(timeout_s * 2)


def bulk_transfer(net: ShapedNetwork, src: str, dst: str, nbytes: int,
                  timeout_s: float = 60.0) -> dict[str, float]:
    """Sends ``nbytes`` over one TCP connection from ``src`` to ``dst``. Returns
    seconds (first to last byte at the receiver), goodput bit/s, and the wire rate
    (bytes through ``src``'s token bucket, headers included, per second)."""
    if nbytes <= 0:
        raise ValueError(f"nbytes must be > 0, got {nbytes}")
    box: dict[str, float] = {}

    def receive(conn: socket.socket) -> None:
        got, first, buf = 0, None, bytearray(1 << 20)
        while got < nbytes:
            n = conn.recv_into(buf)
            if n == 0:
                break
            first = first or time.perf_counter()
            got += n
        box["seconds"] = time.perf_counter() - (first or time.perf_counter())
        box["received"] = got
        conn.sendall(b"k")

    def send(port: int) -> None:
        chunk = memoryview(bytes(1 << 20))
        with socket.create_connection((net.address(dst), port), timeout=timeout_s) as s:
            for offset in range(0, nbytes, len(chunk)):
                s.sendall(chunk[:min(len(chunk), nbytes - offset)])
            s.recv(1)

    before = egress_bytes(net, src)
    with _serving(net, dst, receive, timeout_s) as port:
        net.call(src, lambda: send(port), timeout_s + 5)
    sent = egress_bytes(net, src) - before
    if box.get("received") != nbytes:
        raise NetworkError(f"bulk transfer {src}->{dst}: {box.get('received')} of "
                           f"{nbytes} bytes arrived")
    secs = max(box["seconds"], 1e-9)
    return {"seconds": secs, "goodput_bits": nbytes * 8 / secs,
            "wire_bits": sent * 8 / secs}


def tcp_rtt(net: ShapedNetwork, src: str, dst: str, count: int = 20,
            timeout_s: float = 10.0) -> list[float]:
    """Round trips (seconds) of 1-byte echoes over one TCP_NODELAY connection."""
    count = max(1, min(int(count), 1000))

    def echo(conn: socket.socket) -> None:
        for _ in range(count + 1):
            if not conn.recv(1):
                return
            conn.sendall(b"e")

    def ping(port: int) -> list[float]:
        with socket.create_connection((net.address(dst), port), timeout=timeout_s) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(b"p")
            s.recv(1)  # warm-up (ARP)
            rtts = []
            for _ in range(count):
                t0 = time.perf_counter()
                s.sendall(b"p")
                if not s.recv(1):
                    break
                rtts.append(time.perf_counter() - t0)
            return rtts

    with _serving(net, dst, echo, timeout_s) as port:
        return net.call(src, lambda: ping(port), timeout_s * 2)
