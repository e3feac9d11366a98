"""A TFJob's pods on one machine: what Kubeflow's TFJob operator (training-operator v1.9)
and Kubernetes do with a manifest, rehearsed in network namespaces.

:class:`TFJobRehearsal` takes a TFJob manifest (a dict, as read from YAML) and runs every
replica as a pod: a host of a :class:`~tictac_hooks.cluster.netns.ShapedNetwork`, its own
network namespace and IP address, running the command, args and environment of its
container named ``tensorflow``, as Kubernetes runs them:

- ``TF_CONFIG`` as the operator writes it (:func:`tf_config`): every replica at
  ``<job>-<type>-<i>.<namespace>.svc[.<cluster domain>]:<port>``, the port that of the
  container port named ``tfjob-port`` (default 2222); the sparse form where the manifest
  sets ``enableDynamicWorker``;
- ``env`` entries with ``value`` or a ``fieldRef`` to ``status.podIP``,
  ``metadata.name`` or ``metadata.namespace``; ``$(VAR)`` references in env values,
  command and args expanded as Kubernetes does (an undefined one stays as it is);
- names as headless Services publish them: a replica's name resolves, in every pod's
  ``/etc/hosts``, only once the pod is Ready; Ready when its ``tcpSocket`` readiness
  probe (from a host of its own, the node) connects, or at start without a probe. Each
  pod's ``/etc/hosts`` and ``/etc/resolv.conf`` are its own (``ip netns exec``
  bind-mounts them), with no name server, so nothing else resolves;
- ``workingDir`` and volume mount paths map to local folders (``paths``), since the
  image's file system is not here; ``python`` and ``tictac`` are this environment's.

The job ends when the chief (worker 0 without a chief) exits. Not rehearsed: restarts
(a replica that exits early is an error naming it), resources, other probe types.

Example:
  with TFJobRehearsal(yaml.safe_load(open("deploy/tfjob.yaml")),
                      paths={"/app": "deploy", "/ckpt": tmp}) as job:
      print(job.wait(timeout_s=600), job.log(job.chief))
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Mapping, Sequence

from tictac_hooks.cluster import cleanup
from tictac_hooks.cluster.netns import ShapedNetwork

CONTAINER = "tensorflow"
PORT_NAME = "tfjob-port"
DEFAULT_PORT = 2222
NODE = "node"  # the host the readiness probes come from, as the kubelet's
_VARIABLE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_ORDER = ("Chief", "Master", "PS", "Worker", "Evaluator")  # the operator's order
_RESOLV_CONF = "# no name server: a pod's names come from its /etc/hosts\n" \
               "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


class RehearsalError(RuntimeError):
    """The manifest cannot be rehearsed here, or a pod failed (the message says which)."""


def container_of(replica: Mapping[str, Any], rtype: str) -> dict:
    for c in replica["template"]["spec"]["containers"]:
        if c.get("name") == CONTAINER:
            return c
    raise RehearsalError(f"tfReplicaSpecs.{rtype} has no container named {CONTAINER!r}: "
                         "the operator gives TF_CONFIG to that container only")


def port_of(container: Mapping[str, Any]) -> int:
    """The port the operator writes into TF_CONFIG for this container."""
    for p in container.get("ports", []):
        if p.get("name") == PORT_NAME:
            return int(p["containerPort"])
    return DEFAULT_PORT


def service_name(job: str, rtype: str, index: int, namespace: str,
                 cluster_domain: str = "") -> str:
    """A replica's headless Service, as the operator names it in TF_CONFIG."""
    name = f"{job}-{rtype.lower()}-{index}.{namespace}.svc"
    return f"{name}.{cluster_domain}" if cluster_domain else name


def cluster_spec(manifest: Mapping[str, Any], namespace: str,
                 cluster_domain: str = "") -> dict[str, list[str]]:
    """The cluster every dense TF_CONFIG of the job holds."""
    job = manifest["metadata"]["name"]
    spec = {}
    for rtype, replica in manifest["spec"]["tfReplicaSpecs"].items():
        port = port_of(container_of(replica, rtype))
        spec[rtype.lower()] = [
            f"{service_name(job, rtype, i, namespace, cluster_domain)}:{port}"
            for i in range(int(replica.get("replicas", 1)))]
    return spec


def tf_config(manifest: Mapping[str, Any], rtype: str, index: int, namespace: str,
              cluster_domain: str = "") -> str:
    """TF_CONFIG of one replica, in the operator's form and key order (Go's
    encoding/json: map keys sorted, struct fields in declaration order)."""
    spec = cluster_spec(manifest, namespace, cluster_domain)
    task = {"type": rtype.lower(), "index": index}
    if manifest["spec"].get("enableDynamicWorker"):
        mine = spec.get(task["type"], [])
        sparse = {"worker": {}, "ps": []}
        if task["type"] == "ps":
            sparse["ps"] = [mine[index]]
        elif task["type"] == "worker":
            sparse = {"worker": {str(index): mine[index]}, "ps": spec.get("ps", [])}
        return json.dumps({"cluster": sparse, "task": task}, separators=(",", ":"))
    return json.dumps({"cluster": dict(sorted(spec.items())), "task": task,
                       "environment": "cloud"}, separators=(",", ":"))


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined variables are replaced, ``$$`` is a
    literal ``$``, an undefined reference stays as it is."""
    def one(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return _VARIABLE.sub(one, text)


@dataclasses.dataclass
class Pod:
    """One replica of the job, running in its own network namespace."""

    rtype: str
    index: int
    name: str          # the pod's (and its Service's) name, <job>-<type>-<index>
    service: str       # the name the other replicas reach it by, from TF_CONFIG
    host: str          # its host in the shaped network
    address: str       # its pod IP
    container: dict
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    argv: list[str] = dataclasses.field(default_factory=list)
    process: subprocess.Popen | None = None
    log_path: str = ""
    started: float = 0.0
    ready: float | None = None      # seconds after its start
    next_probe: float = 0.0


class TFJobRehearsal:
    """The pods of a TFJob manifest on this machine (module docstring). Needs root.

    Args:
      manifest: the TFJob, as read from YAML.
      paths: the image's folders (``workingDir``, volume mount paths) -> local folders.
      namespace: the Kubernetes namespace in the names (default "default").
      cluster_domain: what the operator's ``CUSTOM_CLUSTER_DOMAIN`` adds to every name,
        e.g. "cluster.local" (default "": none).
      env: the image's own variables (its ENV lines), under the manifest's; on top of
        this process's environment without TF_CONFIG, with this Python's bin folder
        first on PATH (the image's python and tictac).
      rate: every pod's link rate (default "1gbit").
      say: where progress lines go (default: print).
    """

    def __init__(self, manifest: Mapping[str, Any], paths: Mapping[str, str], *,
                 namespace: str = "default", cluster_domain: str = "",
                 env: Mapping[str, str] | None = None, rate: str = "1gbit",
                 say: Callable[[str], None] | None = None) -> None:
        self.manifest = manifest
        self.paths = {k.rstrip("/"): os.path.abspath(v) for k, v in paths.items()}
        self.namespace = namespace
        self.cluster_domain = cluster_domain
        base = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        base["PATH"] = os.pathsep.join([os.path.dirname(sys.executable),
                                        base.get("PATH", "/usr/bin:/bin")])
        self.image_env = {**base, **(env or {})}
        self.say = say or (lambda line: print(f"[tfjob] {line}", flush=True))
        self.job = manifest["metadata"]["name"]
        replicas = manifest["spec"]["tfReplicaSpecs"]
        unknown = set(replicas) - set(_ORDER)
        if unknown:
            raise RehearsalError(f"replica types {sorted(unknown)} are not TFJob's")
        self.pods: list[Pod] = []
        for rtype in [t for t in _ORDER if t in replicas]:
            c = container_of(replicas[rtype], rtype)
            for i in range(int(replicas[rtype].get("replicas", 1))):
                self.pods.append(Pod(rtype, i, f"{self.job}-{rtype.lower()}-{i}",
                                     service_name(self.job, rtype, i, namespace,
                                                  cluster_domain),
                                     f"{rtype.lower()}{i}", "", c))
        self.chief = next((p for p in self.pods if p.rtype in ("Chief", "Master")),
                          next(p for p in self.pods if p.rtype == "Worker"))
        self.network = ShapedNetwork([p.host for p in self.pods] + [NODE], rate=rate)
        self.log_dir: str | None = None
        self._start = 0.0

    # -- the pods' file system and environment ------------------------------------------

    def local_path(self, text: str) -> str:
        """``text`` with each mapped image folder (at its start or after ``=``) made
        local."""
        for image, local in self.paths.items():
            text = re.sub(rf"(^|=){re.escape(image)}(?=/|$)",
                          lambda m: m.group(1) + local, text)
        return text

    def _prepare(self, pod: Pod) -> None:
        c = pod.container
        folders = [m["mountPath"] for m in c.get("volumeMounts", [])]
        if "workingDir" in c:
            folders.append(c["workingDir"])
        missing = [f for f in folders if f.rstrip("/") not in self.paths]
        if missing:
            raise RehearsalError(f"{pod.name}: no local folder for {missing}; pass paths="
                                 "{image folder: local folder}")
        fields = {"status.podIP": pod.address, "metadata.name": pod.name,
                  "metadata.namespace": self.namespace}
        env: dict[str, str] = {}
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = self.local_path(expand(str(e["value"]), env))
            elif "fieldRef" in e.get("valueFrom", {}):
                path = e["valueFrom"]["fieldRef"]["fieldPath"]
                if path not in fields:
                    raise RehearsalError(f"{pod.name}: env {e['name']} from {path} is not "
                                         f"rehearsed (only {sorted(fields)})")
                env[e["name"]] = fields[path]
            else:
                raise RehearsalError(f"{pod.name}: env {e['name']} comes from "
                                     f"{sorted(e.get('valueFrom', {}))}, not rehearsed")
        env["TF_CONFIG"] = tf_config(self.manifest, pod.rtype, pod.index, self.namespace,
                                     self.cluster_domain)
        pod.env = env
        pod.argv = [self.local_path(expand(a, env))
                    for a in list(c.get("command", [])) + list(c.get("args", []))]
        if not pod.argv:
            raise RehearsalError(f"{pod.name}: the container has no command (the image's "
                                 "entry point is not rehearsed)")

    def _hosts(self, pod: Pod, published: Sequence[Pod]) -> str:
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback",
                 f"{pod.address} {pod.name}"]  # what the kubelet writes
        lines += [f"{p.address} {p.service}" for p in published]
        return "\n".join(lines) + "\n"

    # -- lifecycle ----------------------------------------------------------------------

    def open(self) -> "TFJobRehearsal":
        """Builds the network and each pod's /etc files; starts nothing."""
        cleanup.register(self)
        try:
            self.network.open()
            self.log_dir = tempfile.mkdtemp(prefix="tictac-tfjob-")
            for pod in self.pods:
                pod.address = self.network.address(pod.host)
                self._prepare(pod)
                self.network.write_etc(pod.host, "hosts", self._hosts(pod, []))
                self.network.write_etc(pod.host, "resolv.conf", _RESOLV_CONF)
            self.network.write_etc(NODE, "resolv.conf", _RESOLV_CONF)
        except BaseException:
            self.close()
            raise
        return self

    def start(self) -> None:
        """Starts every pod at once, as the operator creates them; no name resolves yet."""
        self._start = time.monotonic()
        for pod in self.pods:
            pod.log_path = os.path.join(self.log_dir, f"{pod.name}.log")
            env = {**self.image_env, **pod.env}
            cwd = self.local_path(pod.container.get("workingDir", os.getcwd()))
            with open(pod.log_path, "wb") as log:
                pod.process = self.network.run(pod.host, pod.argv, cwd=cwd, env=env,
                                               stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL)
            pod.started = time.monotonic()
            probe = pod.container.get("readinessProbe") or {}
            pod.next_probe = pod.started + float(probe.get("initialDelaySeconds", 0))
            self.say(f"{pod.name} at {pod.address} started: {' '.join(pod.argv)}")

    def _probe(self, pod: Pod) -> bool:
        probe = pod.container.get("readinessProbe")
        if not probe:
            return True
        if "tcpSocket" not in probe:
            raise RehearsalError(f"{pod.name}: only tcpSocket readiness probes are "
                                 f"rehearsed, not {sorted(probe)}")
        port = probe["tcpSocket"]["port"]
        if isinstance(port, str):
            named = {p.get("name"): p.get("containerPort")
                     for p in pod.container.get("ports", [])}
            if port not in named:
                raise RehearsalError(f"{pod.name}: the readiness probe's port {port!r} "
                                     "is not a port of the container")
            port = named[port]
        pod.next_probe = time.monotonic() + float(probe.get("periodSeconds", 10))
        return self.network.can_connect(NODE, f"{pod.address}:{port}", 1.0)

    def _publish(self) -> None:
        published = [p for p in self.pods if p.ready is not None]
        for pod in self.pods:
            self.network.write_etc(pod.host, "hosts", self._hosts(pod, published))

    def wait(self, timeout_s: float = 600.0) -> int:
        """Publishes each pod's name once it is Ready, until the chief exits; returns
        its exit code. A pod that exits first, or a timeout, is a RehearsalError."""
        deadline = time.monotonic() + timeout_s
        while True:
            now = time.monotonic()
            for pod in self.pods:
                code = pod.process.poll()
                if pod is self.chief and code is not None:
                    self.say(f"{pod.name} exited with {code} after {now - pod.started:.1f} s")
                    return code
                if code is not None:
                    raise RehearsalError(f"{pod.name} exited with {code} while the job ran:"
                                         f"\n{self.log(pod)}")
                if pod.ready is None and now >= pod.next_probe and self._probe(pod):
                    pod.ready = time.monotonic() - pod.started
                    self._publish()
                    self.say(f"{pod.name} Ready after {pod.ready:.1f} s: {pod.service} "
                             "resolves in every pod")
            if now > deadline:
                raise RehearsalError(f"{self.chief.name} did not finish within "
                                     f"{timeout_s:.0f} s:\n{self.log(self.chief)}")
            time.sleep(0.2)

    def run_in(self, pod: Pod, argv: Sequence[str], timeout_s: float = 120.0
               ) -> subprocess.CompletedProcess:
        """Runs a command in ``pod``'s namespace with its environment (kubectl exec)."""
        proc = self.network.run(pod.host, list(argv), env={**self.image_env, **pod.env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)

    def log(self, pod: Pod, tail: int = 6000) -> str:
        try:
            with open(pod.log_path, errors="replace") as f:
                return f.read()[-tail:]
        except OSError:
            return ""

    def close(self) -> None:
        """Stops every pod, removes the namespaces, their /etc files and the logs."""
        self.network.close()
        if self.log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
            self.log_dir = None
        cleanup.unregister(self)

    def __enter__(self) -> "TFJobRehearsal":
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()
