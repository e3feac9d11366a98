"""A shaped test network of Linux network namespaces, for clusters on one machine.

:class:`ShapedNetwork` gives every host (a PS, a worker, the chief or a client) its own
network namespace with one interface, ``eth0``, at ``10.213.0.<n>``. Each ``eth0`` is
one end of a veth pair whose other end is a port of a bridge that lives in a namespace
of its own, so nothing is created in the caller's namespace and the private range is
never routed anywhere else. Every link is shaped in both directions with ``tc``: a token
bucket (``tbf``) at ``rate`` on the host's egress and on the bridge port's egress
(towards the host), and, when ``latency_ms`` is set, a ``netem`` delay on the host's
egress, so that the one-way delay between two hosts is ``latency_ms`` and the round
trip ``2 * latency_ms``.

Names: every namespace is ``ttnet-<owner pid>-<random id>-<host>`` (the bridge's host
is ``br``). :meth:`ShapedNetwork.close` (also on ``with`` exit, at interpreter exit and
on SIGINT/SIGTERM) kills the processes it started and deletes its namespaces, which
destroys the veth pairs and the bridge with them (:mod:`tictac_hooks.cluster.cleanup`).
:func:`cleanup_stale` removes what a crashed run (owner pid gone) left behind. What is
measured over such a network (bulk transfers, round trips, bytes through a link) is in
benchmarks/lab/linkmeter.py.

Needs root, ``ip`` and ``tc`` (iproute2), and the ``tbf`` qdisc; ``latency_ms > 0``
also needs ``netem`` (``CONFIG_NET_SCH_NETEM``), which some kernels lack.
:func:`available` says whether it works here, and why not.

Example:
  ok, why = available()
  if ok:
      with ShapedNetwork(["ps0", "worker0"], rate="1gbit") as net:
          print(net.address("ps0"), net.can_connect("worker0", net.address("ps0") + ":22"))
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
from typing import Any, Callable, Iterable, Sequence, TypeVar

from tictac_hooks.cluster import cleanup
from tictac_hooks.cluster.procs import die_with_parent, on_lasting_thread, pid_alive

PREFIX = "ttnet"
SUBNET = "10.213.0"
BRIDGE_HOST = "br"
_CLONE_NEWNET = 0x40000000
_NAME = re.compile(r"^[a-z][a-z0-9]{0,15}$")
_STALE = re.compile(rf"^{PREFIX}-(\d+)-([0-9a-f]+)-")
_GSO_MAX = 64 << 10
# `ip netns exec NS` bind-mounts each file of ETC_NETNS/NS over /etc/ for the command.
ETC_NETNS = "/etc/netns"
T = TypeVar("T")


class NetworkError(RuntimeError):
    """The shaped network cannot be built or used here (the message says why)."""


def _cmd(argv: Sequence[str], check: bool = True, timeout: float = 20.0) -> str:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise NetworkError(f"`{' '.join(argv)}` failed ({out.returncode}): "
                           f"{out.stderr.strip() or out.stdout.strip()}")
    return out.stdout


def _tbf_stats(namespace: str, dev: str) -> dict[str, int]:
    """The token bucket's counters on ``dev`` in ``namespace`` (``tc -s -j``)."""
    out = _cmd(["tc", "-s", "-j", "-n", namespace, "qdisc", "show", "dev", dev])
    for q in json.loads(out or "[]"):
        if q.get("kind") == "tbf":
            return {"bytes": int(q.get("bytes", 0)), "packets": int(q.get("packets", 0)),
                    "drops": int(q.get("drops", 0)),
                    "overlimits": int(q.get("overlimits", 0))}
    raise NetworkError(f"no tbf qdisc on {dev} in {namespace}: {out.strip()[:200]}")


def drops_line(stats: dict[str, dict[str, dict[str, int]]]) -> str:
    """One line from :meth:`ShapedNetwork.queue_stats`: the packets the shaped queues
    dropped, in all and per kind of host and direction where any were."""
    groups: dict[str, list[int]] = {}
    for host, sides in stats.items():
        kind = re.sub(r"\d+$", "", host)
        for side, q in sides.items():
            g = groups.setdefault(f"{kind} {side}", [0, 0])
            g[0] += q["drops"]
            g[1] += q["packets"] + q["drops"]
    dropped = sum(g[0] for g in groups.values())
    total = sum(g[1] for g in groups.values())
    share = dropped / total * 100 if total else 0.0
    where = ", ".join(f"{name} {d / n * 100:.2f} %" for name, (d, n) in sorted(groups.items())
                      if d)
    return (f"shaped queues dropped {dropped:,} of {total:,} packets ({share:.2f} %)"
            + (f": {where}" if where else ""))


def rate_bits(rate: str | int | float) -> int:
    """A rate as bits per second: a number, or ``<n>[k|m|g]bit`` (SI, as ``tc``)."""
    if isinstance(rate, (int, float)):
        bits = float(rate)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmg]?)(?:bit)?\s*", rate.lower())
        if not m:
            raise ValueError(f"rate {rate!r} is not a number of bit/s or like '1gbit', "
                             f"'100mbit', '500kbit'")
        bits = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    if bits < 8000:
        raise ValueError(f"rate {rate!r} is below 8 kbit/s")
    return int(bits)


@dataclasses.dataclass(frozen=True)
class LinkShape:
    """How one host's link is shaped (both directions)."""

    rate_bits: int
    latency_ms: float = 0.0
    queue_ms: float = 20.0

    @property
    def burst_bytes(self) -> int:
        # >= one GSO packet (so tbf never splits them), about 1 ms at the rate.
        return max(2 * _GSO_MAX, self.rate_bits // 8 // 1000)

    @property
    def limit_bytes(self) -> int:
        return self.burst_bytes + max(2 * _GSO_MAX, int(self.rate_bits / 8 * self.queue_ms / 1e3))

    def tbf_args(self) -> list[str]:
        return ["tbf", "rate", f"{self.rate_bits}bit", "burst", str(self.burst_bytes),
                "limit", str(self.limit_bytes)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL("libc.so.6", use_errno=True)


def _enter_netns(namespace: str) -> None:
    """Moves the calling thread (only it) into a named network namespace."""
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if _libc().setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {namespace}: {os.strerror(err)}")
    finally:
        os.close(fd)


def call_in_netns(namespace: str, fn: Callable[[], T], timeout_s: float = 60.0) -> T:
    """Runs ``fn`` in a fresh thread inside a network namespace; its sockets stay
    there. Raises what ``fn`` raised, or TimeoutError."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            _enter_netns(namespace)
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    thread = threading.Thread(target=target, name=f"netns-{namespace}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"a call in namespace {namespace} took over {timeout_s} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _namespaces() -> list[str]:
    if shutil.which("ip") is None:
        return []
    return [line.split()[0] for line in _cmd(["ip", "netns", "list"], check=False).splitlines()
            if line.strip()]


def _kill_namespace_processes(namespace: str) -> None:
    for pid in _cmd(["ip", "netns", "pids", namespace], check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            os.kill(int(pid), signal.SIGKILL)


def _delete_namespaces(names: Iterable[str]) -> None:
    for name in names:
        _kill_namespace_processes(name)
        _cmd(["ip", "netns", "delete", name], check=False)
        shutil.rmtree(os.path.join(ETC_NETNS, name), ignore_errors=True)


def cleanup_stale(force: bool = False) -> list[str]:
    """Deletes namespaces (and so their links) that earlier runs left behind: those
    named ``ttnet-<pid>-...`` whose owner process is gone (every ``ttnet-`` namespace
    not owned by a live network of this process when ``force``). Returns their names."""
    own = {ns for net in cleanup.live() if isinstance(net, ShapedNetwork)
           for ns in net.namespaces()}
    stale = []
    leftover = os.listdir(ETC_NETNS) if os.path.isdir(ETC_NETNS) else []
    for name in sorted(set(_namespaces()) | set(leftover)):
        m = _STALE.match(name)
        if m and name not in own and (force or not pid_alive(int(m.group(1)))):
            stale.append(name)
    _delete_namespaces(stale)
    return stale


def available(latency: bool = False) -> tuple[bool, str]:
    """(True, "") when a shaped network can be built here, else (False, why): not root,
    no ``ip``/``tc``, no namespaces, no ``tbf`` (or ``netem`` when ``latency``)."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return False, "network namespaces need Linux"
    if os.geteuid() != 0:
        return False, f"network namespaces need root (running as uid {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` (iproute2) is not installed"
    probe = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}-probe"
    try:
        _cmd(["ip", "netns", "add", probe])
        _cmd(["ip", "-n", probe, "link", "add", "probe0", "type", "veth", "peer", "name",
              "probe1"])
        _cmd(["tc", "-n", probe, "qdisc", "add", "dev", "probe0", "root"] +
             LinkShape(rate_bits(1e9)).tbf_args())
        if latency:
            try:
                _cmd(["tc", "-n", probe, "qdisc", "add", "dev", "probe1", "root", "netem",
                      "delay", "1ms"])
            except NetworkError as e:
                return False, (f"the netem qdisc (needed for latency) is missing in this "
                               f"kernel (CONFIG_NET_SCH_NETEM): {e}")
        return True, ""
    except (NetworkError, OSError, subprocess.SubprocessError) as e:
        return False, f"cannot build a shaped network here: {e}"
    finally:
        with contextlib.suppress(Exception):
            _cmd(["ip", "netns", "delete", probe], check=False)


class ShapedNetwork:
    """Hosts in network namespaces on a bridge, each link shaped in both directions.

    Args:
      hosts: host names, lowercase letters and digits starting with a letter (e.g.
        "ps0", "worker0", "client"); each gets a namespace and an address.
      rate: every link's rate, both directions: bit/s or a tc string like "1gbit"
        (default "1gbit").
      latency_ms: one-way delay between two hosts, added on each host's egress with
        netem (default 0: none; > 0 fails where the kernel has no netem).
      queue_ms: the token bucket's queue, in milliseconds at the rate (default 20).
      mtu: the links' MTU (default: the veth default, 1500).
      subnet: the /24 the hosts live in, only inside these namespaces (default
        "10.213.0").

    Example:
      with ShapedNetwork(["ps0", "worker0"], rate="100mbit") as net:
          proc = net.run("ps0", ["python3", "-c", "print('hi')"])
    """

    def __init__(self, hosts: Sequence[str], rate: str | int | float = "1gbit",
                 latency_ms: float = 0.0, queue_ms: float = 20.0, mtu: int | None = None,
                 subnet: str = SUBNET) -> None:
        hosts = list(hosts)
        bad = [h for h in hosts if not _NAME.match(h) or h == BRIDGE_HOST]
        if bad or not hosts or len(set(hosts)) != len(hosts) or len(hosts) > 250:
            raise ValueError(f"hosts must be 1 to 250 distinct names of lowercase letters "
                             f"and digits starting with a letter, not {BRIDGE_HOST!r}; "
                             f"got {hosts!r}")
        if latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {latency_ms}")
        self.hosts = hosts
        self.shape = LinkShape(rate_bits(rate), float(latency_ms), float(queue_ms))
        self.mtu = mtu
        self.subnet = subnet
        self.id = f"{os.getpid()}-{secrets.token_hex(3)}"
        self._shapes = {h: self.shape for h in hosts}
        self._procs: list[subprocess.Popen] = []
        self._open = False

    # -- names and addresses ---------------------------------------------------------

    def namespace(self, host: str) -> str:
        """The network namespace of ``host`` (or of the bridge, ``"br"``)."""
        if host != BRIDGE_HOST and host not in self.hosts:
            raise KeyError(f"no host {host!r} in this network; hosts: {self.hosts}")
        return f"{PREFIX}-{self.id}-{host}"

    def namespaces(self) -> list[str]:
        return [self.namespace(h) for h in self.hosts] + [self.namespace(BRIDGE_HOST)]

    def address(self, host: str) -> str:
        """The IPv4 address of ``host`` (reachable from every other host)."""
        self.namespace(host)
        return f"{self.subnet}.{self.hosts.index(host) + 1}"

    # -- lifecycle -------------------------------------------------------------------

    def open(self) -> "ShapedNetwork":
        """Builds the namespaces, the bridge and the shaped links."""
        if self._open:
            return self
        if self.shape.latency_ms > 0:
            ok, why = available(latency=True)
            if not ok:
                raise NetworkError(f"latency_ms={self.shape.latency_ms} cannot be "
                                   f"emulated here: {why}; use latency_ms=0")
        cleanup.register(self)
        self._open = True
        try:
            br = self.namespace(BRIDGE_HOST)
            _cmd(["ip", "netns", "add", br])
            _cmd(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
            _cmd(["ip", "-n", br, "link", "set", "br0", "up"])
            for i, host in enumerate(self.hosts):
                ns = self.namespace(host)
                port = f"p{i}"
                _cmd(["ip", "netns", "add", ns])
                _cmd(["ip", "-n", br, "link", "add", port, "type", "veth", "peer", "name",
                      "eth0", "netns", ns])
                if self.mtu:
                    _cmd(["ip", "-n", br, "link", "set", port, "mtu", str(self.mtu)])
                    _cmd(["ip", "-n", ns, "link", "set", "eth0", "mtu", str(self.mtu)])
                _cmd(["ip", "-n", br, "link", "set", port, "master", "br0", "up"])
                _cmd(["ip", "-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0"])
                _cmd(["ip", "-n", ns, "link", "set", "eth0", "up"])
                _cmd(["ip", "-n", ns, "link", "set", "lo", "up"])
                self._apply_shape(host, self.shape)
            self._check_connectivity()
        except BaseException:
            self.close()
            raise
        return self

    def _apply_shape(self, host: str, shape: LinkShape) -> None:
        ns, br = self.namespace(host), self.namespace(BRIDGE_HOST)
        port = f"p{self.hosts.index(host)}"
        # Towards the host: the bridge port's egress.
        _cmd(["tc", "-n", br, "qdisc", "replace", "dev", port, "root", "handle", "1:"] +
             shape.tbf_args())
        # From the host: its eth0's egress (netem delay first when there is latency).
        _cmd(["tc", "-n", ns, "qdisc", "del", "dev", "eth0", "root"], check=False)
        if shape.latency_ms > 0:
            bdp_packets = int(shape.rate_bits / 8 * shape.latency_ms / 1e3 / 1500) * 2
            _cmd(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:",
                  "netem", "delay", f"{shape.latency_ms}ms",
                  "limit", str(max(10000, bdp_packets))])
            _cmd(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "parent", "1:1",
                  "handle", "10:"] + shape.tbf_args())
        else:
            _cmd(["tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:"] +
                 shape.tbf_args())
        self._shapes[host] = shape

    def reshape(self, host: str | None = None, rate: str | int | float | None = None,
                latency_ms: float | None = None) -> None:
        """Changes the shape of one host's link (every link when ``host`` is None)."""
        for h in ([host] if host else self.hosts):
            old = self._shapes[h]
            new = dataclasses.replace(
                old, rate_bits=rate_bits(rate) if rate is not None else old.rate_bits,
                latency_ms=old.latency_ms if latency_ms is None else float(latency_ms))
            if new.latency_ms > 0 and old.latency_ms == 0:
                ok, why = available(latency=True)
                if not ok:
                    raise NetworkError(f"latency_ms={new.latency_ms} cannot be emulated "
                                       f"here: {why}")
            self._apply_shape(h, new)

    def queue_stats(self) -> dict[str, dict[str, dict[str, int]]]:
        """Per host, what its shaped queues did since the network opened: ``out`` (its
        eth0's token bucket) and ``in`` (the bridge port's, towards it), each with
        bytes and packets sent, packets dropped at the full queue and overlimits (a
        packet that waited for tokens). Drops mean TCP lost packets on that link
        (retransmits, possibly 200 ms timeouts), so a run's times include them."""
        stats: dict[str, dict[str, dict[str, int]]] = {}
        br = self.namespace(BRIDGE_HOST)
        for i, host in enumerate(self.hosts):
            stats[host] = {"out": _tbf_stats(self.namespace(host), "eth0"),
                           "in": _tbf_stats(br, f"p{i}")}
        return stats

    def _check_connectivity(self, timeout_s: float = 5.0) -> None:
        """Every host reaches the first one (and the first reaches the second)."""
        if len(self.hosts) < 2:
            return
        first = self.hosts[0]
        with self.listener(first) as (_, port):
            for host in self.hosts[1:]:
                if not self.can_connect(host, f"{self.address(first)}:{port}", timeout_s):
                    raise NetworkError(f"{host} cannot reach {first} at "
                                       f"{self.address(first)}:{port} on the new bridge")

    def close(self) -> None:
        """Kills the processes started with :meth:`run` and deletes every namespace of
        this network (idempotent)."""
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self._procs:
            with contextlib.suppress(Exception):
                proc.wait(10)
        if self._open:
            present = set(_namespaces())
            _delete_namespaces([ns for ns in self.namespaces() if ns in present])
            for ns in self.namespaces():
                shutil.rmtree(os.path.join(ETC_NETNS, ns), ignore_errors=True)
            self._open = False
        cleanup.unregister(self)

    def __enter__(self) -> "ShapedNetwork":
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- running things in a host ----------------------------------------------------

    def write_etc(self, host: str, name: str, text: str) -> None:
        """Writes ``/etc/<name>`` as ``host``'s processes see it (e.g. "hosts",
        "resolv.conf"): ``ip netns exec`` bind-mounts the file over the machine's own.
        Write it before :meth:`run`; later writes rewrite the same file in place, so the
        processes already running read the new text (glibc reads /etc/hosts on every
        lookup). :meth:`close` removes it."""
        if not re.fullmatch(r"[a-z][a-z.]*", name):
            raise ValueError(f"an /etc file name of lowercase letters and dots, got {name!r}")
        folder = os.path.join(ETC_NETNS, self.namespace(host))
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, name), "w") as f:  # truncates: same inode
            f.write(text)

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` prefixed to run in ``host``'s namespace (``ip netns exec``)."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def run(self, host: str, argv: Sequence[str], **popen: Any) -> subprocess.Popen:
        """Starts ``argv`` in ``host``'s namespace; it runs in its own process group,
        dies with the caller, and is killed by :meth:`close`."""
        if not self._open:
            raise NetworkError("the network is not open: use `with ShapedNetwork(...)`")
        popen.setdefault("preexec_fn", die_with_parent)
        command = self.command(host, argv)
        proc = on_lasting_thread(lambda: subprocess.Popen(command, **popen))
        self._procs.append(proc)
        return proc

    def call(self, host: str, fn: Callable[[], T], timeout_s: float = 60.0) -> T:
        """Runs ``fn`` in a thread inside ``host``'s namespace (see call_in_netns)."""
        return call_in_netns(self.namespace(host), fn, timeout_s)

    def can_connect(self, host: str, address: str, timeout_s: float = 1.0) -> bool:
        """Whether a TCP connection from ``host`` to ``HOST:PORT`` succeeds."""
        target_host, port = address.rsplit(":", 1)

        def attempt() -> bool:
            try:
                with socket.create_connection((target_host.strip("[]"), int(port)),
                                              timeout=timeout_s):
                    return True
            except OSError:
                return False
        return self.call(host, attempt, timeout_s + 5)

    @contextlib.contextmanager
    def listener(self, host: str):
        """A listening TCP socket on ``host``'s address: yields (socket, port)."""
        addr = self.address(host)

        def make() -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((addr, 0))
            s.listen(256)  # every other host connects at once (never accepted)
            return s
        sock = self.call(host, make, 10)
        try:
            yield sock, sock.getsockname()[1]
        finally:
            sock.close()

def cluster_hosts(num_ps: int, num_workers: int, chief: bool = False,
                  clients: Sequence[str] = ("client",)) -> list[str]:
    """The host names :class:`~tictac_hooks.cluster.launcher.LocalCluster` expects:
    ps0.., worker0.., "chief" when ``chief``, then ``clients``."""
    return ([f"ps{i}" for i in range(num_ps)] + [f"worker{i}" for i in range(num_workers)]
            + (["chief"] if chief else []) + list(clients))
