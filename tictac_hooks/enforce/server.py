"""A drop-in for ``tf.distribute.Server`` for PS tasks, with the TicTac gate.

Two backends:
- ``native`` (default): the PS process loads the TicTac library and serves with
  protocol ``grpc+tictac``; the gate runs inside the PS's own gRPC worker service, on
  the address the cluster spec names. No extra hop, no extra port.
- ``proxy``: the TensorFlow server binds a private port and the HTTP/2 rendezvous
  listens on the cluster-spec address in front of it (a sidecar, for PS images that
  cannot load a library).

TensorFlow is imported when a server is built, not at module import.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from tictac_hooks import checks
from tictac_hooks.ports import free_port
from tictac_hooks.enforce.api import BACKENDS
from tictac_hooks.enforce.gate import DEFAULT_SKIP_AFTER_S, DEFAULT_WORKERS, Gate
from tictac_hooks.enforce.proxy import Rendezvous, RendezvousThread
from tictac_hooks.records import GateStats

DEFAULT_BIND_HOST = "127.0.0.1"
NATIVE_PROTOCOL = "grpc+tictac"


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` -> (host, port), the port in 1..65535."""
    return checks.address("address", address)


def bracketed(host: str) -> str:
    """``host`` as it goes before ``:PORT``: a bare IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _tf_server(server_def: Any, port: int, what: str) -> Any:
    """``tf.distribute.Server(server_def, start=False)``; a port that is taken is a
    one-line error naming it (TensorFlow says only "Could not start gRPC server", or
    shares the port with another TensorFlow server without a word: SO_REUSEPORT)."""
    import tensorflow as tf

    checks.port_free(port, what)
    try:
        return tf.distribute.Server(server_def, start=False)
    except tf.errors.UnknownError as e:
        if "Could not start gRPC server" not in str(e):
            raise
        raise checks.PortInUseError(
            f"{what}: TensorFlow could not start its gRPC server on port {port} (in use, "
            "or not allowed); choose another port") from None


def sized_workers(cluster: Mapping[str, Any], workers: int | None = None) -> int:
    """The workers a PS's gate is sized for: ``workers`` where given (a whole number >=
    1), else the cluster's worker and chief tasks, at least ``DEFAULT_WORKERS``."""
    if workers is not None:
        return checks.whole_number("workers", workers, 1)
    tasks = sum(len(cluster.get(job) or ()) for job in ("worker", "chief"))
    return max(DEFAULT_WORKERS, tasks)


class TicTacServer:
    """A ``tf.distribute.Server`` for a PS task, with the TicTac gate.

    Native backend (default): a ``grpc+tictac`` server on this task's cluster-spec
    address; the gate is in-process. Proxy backend: the TensorFlow server binds
    ``private_port`` (``ServerDef.port``); the rendezvous listens on this task's address
    in the cluster spec (port from the spec, host ``bind_host``) and forwards everything
    to the TensorFlow server.

    Args:
      server_or_cluster_def: a ``tf.train.ClusterSpec``, ``ClusterDef``, ``ServerDef``
        or dict job -> list of addresses, as for ``tf.distribute.Server``.
      job_name: default "ps".
      task_index: default 0.
      protocol: default "grpc" (the wire protocol; the native backend serves it as
        "grpc+tictac").
      config: a ``tf.compat.v1.ConfigProto`` for the TensorFlow server.
      start: start at once (default True).
      backend: "native" (default) or "proxy".
      skip_after_s: the gate's skip bound, the same bound as ``--tictac_skip_timeout``
        (default ``DEFAULT_SKIP_AFTER_S``, 2.0 s; ignored when ``gate`` is given).
      private_port: proxy only: the TensorFlow server's own port, 1..65535 (default 0: a
        free one).
      bind_host: where the PS listens. Native: its one port, on this host (default: the
        host of its cluster-spec address). Proxy: the rendezvous (default "127.0.0.1"; "0.0.0.0"
        or "[::]" to serve other machines).
      gate: proxy only: the ordering gate (default ``Gate()``).
      workers: the workers the gate's bounds (its history of step records, its memory
        bound on live steps) are sized for (default: the cluster spec's worker and chief
        tasks, at least ``DEFAULT_WORKERS``, 64; ignored when ``gate`` is given).

    Example:
      server = TicTacServer({"ps": ["localhost:2222"], "worker": ["localhost:2223"]},
                            job_name="ps", task_index=0)
      server.join()
    """

    def __init__(self, server_or_cluster_def: Any, job_name: str | None = None,
                 task_index: int | None = None, protocol: str | None = None,
                 config: Any = None, start: bool = True, *, backend: str = "native",
                 skip_after_s: float | None = None, private_port: int = 0,
                 bind_host: str | None = None, gate: Gate | None = None,
                 workers: int | None = None) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be 'native' or 'proxy', got {backend!r}")
        skip_after_s = checks.seconds(
            "skip_after_s", DEFAULT_SKIP_AFTER_S if skip_after_s is None else skip_after_s)
        checks.port("private_port", private_port, zero_picks_one=True)
        if isinstance(server_or_cluster_def, Mapping):
            checks.cluster_addresses(server_or_cluster_def)
        import tensorflow as tf

        if isinstance(server_or_cluster_def, tf.train.ServerDef):
            server_def = tf.train.ServerDef()
            server_def.CopyFrom(server_or_cluster_def)
        else:
            if isinstance(server_or_cluster_def, Mapping):
                server_or_cluster_def = tf.train.ClusterSpec(dict(server_or_cluster_def))
            elif not isinstance(server_or_cluster_def, tf.train.ClusterSpec):
                server_or_cluster_def = tf.train.ClusterSpec(server_or_cluster_def)
            server_def = tf.train.ServerDef(
                cluster=server_or_cluster_def.as_cluster_def(),
                job_name=job_name or "ps", task_index=task_index or 0,
                protocol=protocol or "grpc")
            if config is not None:
                server_def.default_session_config.CopyFrom(config)
        if server_def.protocol not in ("", "grpc", NATIVE_PROTOCOL):
            raise ValueError(f"the TicTac gate needs protocol 'grpc', got "
                             f"{server_def.protocol!r}")
        spec = tf.train.ClusterSpec(server_def.cluster)
        try:
            public = spec.task_address(server_def.job_name, server_def.task_index)
        except (KeyError, ValueError):
            raise ValueError(f"the cluster spec has no task {server_def.job_name}:"
                             f"{server_def.task_index}: {spec.as_dict()}") from None
        checks.cluster_addresses(spec.as_dict())
        workers = sized_workers(spec.as_dict(), workers)
        _, public_port = split_address(public)
        task = f"{server_def.job_name}:{server_def.task_index}"
        self.backend = backend
        self.public_address = public
        self.rendezvous = None
        self._thread: RendezvousThread | None = None
        self.server_def = server_def
        if backend == "native":
            from tictac_hooks.enforce.native.build import load, loaded_path
            from tictac_hooks.enforce.native.cgate import CGate

            load()
            server_def.protocol = NATIVE_PROTOCOL
            self.private_address = public  # the gate is inside this server
            # The server listens on its cluster-spec host unless told otherwise
            # (tf_server.cc reads TICTAC_BIND_HOST while the server starts).
            old = os.environ.get("TICTAC_BIND_HOST")
            if bind_host:
                os.environ["TICTAC_BIND_HOST"] = bracketed(bind_host)
            try:
                self._server = _tf_server(server_def, public_port,
                                          f"{task}'s address {public} in the cluster spec")
            finally:
                if bind_host:
                    if old is None:
                        os.environ.pop("TICTAC_BIND_HOST", None)
                    else:
                        os.environ["TICTAC_BIND_HOST"] = old
            self._cgate = CGate.server(loaded_path())
            if self._cgate is None:
                raise RuntimeError("the grpc+tictac server started without its gate")
            # Always explicit: the C++ gate's built-in default is not the one to use.
            self._cgate.control("configure", f"skip_after_s\t{skip_after_s!r}\n"
                                             f"workers\t{workers}\n")
            if start:
                self.start()
            return
        server_def.port = private_port or free_port()
        self.private_address = f"127.0.0.1:{server_def.port}"
        self._server = _tf_server(server_def, server_def.port,
                                  f"{task}'s private port (private_port)")
        if gate is None:
            gate = Gate(skip_after_s=skip_after_s, workers=workers)
        host = bracketed(bind_host or DEFAULT_BIND_HOST)
        self.rendezvous = Rendezvous(f"{host}:{public_port}", self.private_address, gate=gate)
        if start:
            self.start()

    @property
    def listening(self) -> str:
        """Where this PS accepts connections, as ``HOST:PORT`` entries: the native
        server's one port on the host it bound; the proxy's rendezvous, and the
        TensorFlow server behind it, which TensorFlow binds on every interface."""
        port = split_address(self.public_address)[1]
        if self.backend == "native":
            host = self._cgate.control("ping").get("listening") or "*"
            return f"{'0.0.0.0' if host == '*' else host}:{port}"
        return (f"{self.rendezvous.address} (rendezvous), 0.0.0.0:"
                f"{split_address(self.private_address)[1]} (TensorFlow's server)")

    @property
    def target(self) -> str:
        """The public target, ``grpc://<address in the cluster spec>``."""
        return f"grpc://{self.public_address}"

    @property
    def gate(self) -> Gate:
        """The proxy's Python gate (the native gate is read with :meth:`stats`)."""
        if self.rendezvous is None:
            raise AttributeError("a native TicTacServer's gate is in C++: use stats()")
        return self.rendezvous.gate

    def stats(self, include_active: bool = True) -> GateStats:
        """This PS's gate summary and step records, as the clients return them."""
        if self.rendezvous is None:
            return GateStats.from_json(self._cgate.control(
                "stats", "active" if include_active else "finished"),
                ps=self.public_address, backend="native")
        return self.rendezvous.stats(include_active)

    def start(self) -> None:
        self._server.start()
        if self.rendezvous is not None and self._thread is None:
            self._thread = RendezvousThread(self.rendezvous).start()

    def join(self) -> None:
        """Blocks until the server stops (a TensorFlow server never stops by itself)."""
        if self._thread is None:
            self._server.join()
        else:
            self._thread.join()

    def stop(self) -> None:
        """Stops the rendezvous (TensorFlow servers cannot be stopped in-process)."""
        if self._thread is not None:
            self._thread.stop()
