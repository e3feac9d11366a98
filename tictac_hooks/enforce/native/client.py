"""Control of a native PS (protocol ``grpc+tictac``) through TensorFlow's own runtime.

The ``TictacControl`` op of the native library runs on the PS device, in a session whose
target is the PS itself (its master places the op on its own CPU): no extra port. The
client process loads the library only to build that op; it runs no server.

Wire format of the ``install`` argument (``control.cc``): ``key<TAB>value`` lines
(``algorithm``, ``skip_after_s``), a line ``order``, then ``name<TAB>priority`` lines.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from tictac_hooks import checks
from tictac_hooks.checks import check_window
from tictac_hooks.enforce.api import GateClient, GateError, check_install_size
from tictac_hooks.enforce.gate import InstallResult
from tictac_hooks.graph.schedule import Schedule, ScheduleError
from tictac_hooks.records import GateStats

_DEVICES: dict[str, str] = {}  # address -> the PS device found there (asked once)
GET_STATUS = "/tensorflow.WorkerService/GetStatus"


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def _fields(buf: bytes):
    """(field number, wire type, value) of a protobuf message's top-level fields."""
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def device_names(get_status_response: bytes) -> list[str]:
    """Device names in a serialized GetStatusResponse (worker.proto: field 1, repeated
    DeviceAttributes, whose field 1 is the name; worker.proto is not in the wheel, see
    patches/tf_worker_proto.py)."""
    names = []
    for number, wire, value in _fields(get_status_response):
        if number == 1 and wire == 2:
            for n2, w2, v2 in _fields(value):
                if n2 == 1 and w2 == 2:
                    names.append(v2.decode())
    return names


def gate_message(text: str) -> str:
    """The gate's own words in a TensorFlow op error. Run in a graph, the op's message
    comes wrapped: ``Graph execution error:``, where the node was defined, then
    ``From /job:ps/...:``, the message, and ``[[{{node TictacControl}}]]``."""
    lines = [line.strip() for line in text.strip().splitlines()]
    for i, line in enumerate(lines):
        if line.startswith("From /job:"):
            own = [x for x in lines[i + 1:] if x and not x.startswith("[[")]
            if own:
                return " ".join(own)
    return next((x for x in lines if x and x != "Graph execution error:"), text.strip())


class NativeGateError(GateError):
    """A native PS could not be reached, has no TicTac gate, or refused a request."""


def install_argument(schedule: Schedule, skip_after_s: float | None = None,
                     pace_rate: float | None = None, window_bytes: int | None = None,
                     align: bool | None = None) -> str:
    if any("\t" in n or "\n" in n for n in schedule.order):
        raise ScheduleError("transfer names must not contain TAB or newline characters")
    head = [f"algorithm\t{schedule.algorithm}"]
    if skip_after_s is not None:
        head.append(f"skip_after_s\t{float(skip_after_s)!r}")
    if pace_rate is not None:
        head.append(f"pace_rate\t{float(pace_rate)!r}")
    if window_bytes is not None:
        head.append(f"window_bytes\t{int(window_bytes)}")
    if align is not None:
        head.append(f"align\t{int(bool(align))}")
    lines = head + ["order"] + [f"{n}\t{schedule.priority[n]}" for n in schedule.order]
    return "\n".join(lines) + "\n"


class NativeClient(GateClient):
    """Talks to the native gate of the PS at ``address``.

    Args:
      address: ``HOST:PORT``, the PS's address in the cluster spec.
      timeout_s: per call (default 10 s; TensorFlow's ``operation_timeout_in_ms``).
      device: the PS's device, ``/job:ps/replica:0/task:<i>`` (default: read from that
        PS's own device list, its worker service's GetStatus).
    """

    backend = "native"
    unhonoured: dict[str, str] = {}  # every install setting (window_bytes while pacing)

    def __init__(self, address: str, timeout_s: float = 10.0, device: str | None = None) -> None:
        from tictac_hooks.enforce.native.build import load

        checks.seconds("timeout_s", timeout_s)
        self.address = address
        self.timeout_s = timeout_s
        self._lib = load()
        self._device = device
        self._session = None
        self._lock = threading.Lock()

    def _config(self, device_filter: str) -> Any:
        import tensorflow as tf

        return tf.compat.v1.ConfigProto(
            device_filters=[device_filter],
            operation_timeout_in_ms=max(1, int(self.timeout_s * 1000)))

    def _errors(self, e: Exception) -> Exception:
        import tensorflow as tf

        text = getattr(e, "message", str(e))
        if "TictacControl" in text and ("not registered" in text or "NotFound" in text):
            return NativeGateError(
                f"the PS at {self.address} has no TicTac gate (a plain TensorFlow server?); "
                "start PS tasks with `tictac ps` (protocol grpc+tictac)")
        if isinstance(e, tf.errors.InvalidArgumentError):
            return ScheduleError(f"PS at {self.address}: {gate_message(text)}")
        if isinstance(e, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)):
            return NativeGateError(
                f"cannot reach the TicTac PS at {self.address} within {self.timeout_s:g} s "
                f"({type(e).__name__}); is the PS running, and is this its address in the "
                "cluster spec?")
        return NativeGateError(f"PS at {self.address}: {type(e).__name__}: {text[:500]}")

    def _discover(self) -> str:
        """The PS's own task, from its worker service's GetStatus (its local devices):
        asks that PS alone, so other tasks of the cluster need not be up."""
        import grpc

        with grpc.insecure_channel(self.address) as channel:
            get_status = channel.unary_unary(GET_STATUS)
            try:
                reply = get_status(b"", timeout=self.timeout_s)
            except grpc.RpcError as e:
                raise NativeGateError(
                    f"cannot reach the TicTac PS at {self.address}: {e.code().name}: "
                    f"{e.details()}; is the PS running, and is this its address in the "
                    "cluster spec?") from None
        names = device_names(reply)
        cpu = [n for n in names if "/device:CPU:" in n] or names
        if not cpu:
            raise NativeGateError(f"the TensorFlow server at {self.address} lists no devices")
        name = cpu[0]
        return name[:name.index("/device:")] if "/device:" in name else name

    def _open(self) -> None:
        import tensorflow as tf

        if self._device is None:
            self._device = _DEVICES.get(self.address) or self._discover()
            _DEVICES[self.address] = self._device
        g = tf.Graph()
        with g.as_default(), tf.device(self._device):
            self._verb = tf.compat.v1.placeholder(tf.string, [])
            self._arg = tf.compat.v1.placeholder(tf.string, [])
            self._reply = self._lib.tictac_control(self._verb, self._arg)
        self._session = tf.compat.v1.Session(f"grpc://{self.address}", graph=g,
                                             config=self._config(self._device))

    def call(self, verb: str, arg: str = "") -> Any:
        """Runs one control verb on the PS; returns its JSON reply. A PS restarted since
        the last call does not know this client's session (AbortedError): the call is
        made once more in a new session."""
        import tensorflow as tf

        with self._lock:
            for attempt in (1, 2):
                try:
                    if self._session is None:
                        self._open()
                    reply = self._session.run(self._reply, {self._verb: verb,
                                                            self._arg: arg})
                    break
                except (ScheduleError, NativeGateError):
                    raise
                except Exception as e:  # noqa: BLE001 - TensorFlow's errors, translated
                    self._close_session()
                    _DEVICES.pop(self.address, None)  # a restarted PS may be another task
                    if attempt == 1 and isinstance(e, tf.errors.AbortedError):
                        continue  # its session is gone: the PS was restarted
                    raise self._errors(e) from None
        return json.loads(reply.decode())

    def _close_session(self) -> None:
        if self._session is not None:
            try:
                self._session.close()
            except Exception:  # noqa: BLE001 - closing a session to a dead PS
                pass
            self._session = None

    def close(self) -> None:
        with self._lock:
            self._close_session()

    @property
    def device(self) -> str | None:
        return self._device

    # -- the GateClient interface ---------------------------------------------------------

    def ping(self) -> bool:
        """True if the PS answers and enforces (its gate runs in a grpc+tictac server)."""
        reply = self.call("ping")
        if reply.get("bypassed"):
            raise NativeGateError(
                f"the PS at {self.address} has its gate bypassed (the `bypass 1` "
                "measurement setting), so it enforces no order; run "
                "NativeClient.call('bypass', '0') on it")
        if not reply.get("enforcing"):
            raise NativeGateError(
                f"the PS at {self.address} loaded the TicTac library but serves with plain "
                "gRPC, so it cannot enforce an order; start it with `tictac ps`")
        return bool(reply.get("ok"))

    def install(self, schedule: Schedule, skip_after_s: float | None = None,
                window_bytes: int | None = None,
                pace_rate: float | None = None, align: bool | None = None) -> InstallResult:
        """Installs ``schedule``; steps starting after this run under it. ``skip_after_s``
        also sets the PS's skip bound. ``pace_rate`` (bytes/s of the PS's link; 0: off)
        turns on pacing: the next transfer is handed to gRPC only while the bytes handed
        back and not yet drained at that rate are at most ``window_bytes`` (gate.h,
        "Pacing"). Without pacing the next transfer goes the moment its turn comes.
        ``align`` (default: the PS's, on) picks among the destinations of a step whose
        turn came while pacing: True, the furthest behind first; False, one destination
        after the other (gate.h, "Which waiting transfer goes")."""
        if window_bytes is not None:
            check_window(window_bytes)
        if skip_after_s is not None:
            checks.seconds("skip_after_s", skip_after_s)
        if pace_rate is not None and not (pace_rate >= 0 and pace_rate != float("inf")):
            raise ValueError(f"pace_rate must be a finite number of bytes/s >= 0 (0: no "
                             f"pacing), got {pace_rate!r}")
        argument = install_argument(schedule, skip_after_s, pace_rate,
                                    window_bytes if pace_rate else None, align)
        check_install_size(schedule, len(argument.encode()), self.address)
        r = self.call("install", argument)
        return InstallResult(r["version"], r["transfers"], r["expected"],
                             tuple(r["unmatched"]), r["served"])

    def clear(self) -> int:
        return int(self.call("clear")["version"])

    def stats(self, include_active: bool = True, since: int | None = None) -> GateStats:
        """Totals plus the step records; with ``since``, only those finished after
        record number ``since``, with ``last_seq`` and ``dropped`` (gate.h, StatsJson)."""
        arg = "active" if include_active else "finished"
        if since is not None:
            arg += f" since={checks.whole_number('since', since, 0)}"
        return GateStats.from_json(dict(self.call("stats", arg), device=self._device),
                                   ps=self.address, backend="native")

    def served_names(self) -> list[str]:
        return list(self.call("served")["names"])
