"""A task's cluster from TF_CONFIG, and the PS's own listening host, as Kubernetes runs them.

Kubeflow's TFJob operator (training-operator v1) gives the container named
``tensorflow`` of every pod ``TF_CONFIG`` in one of two forms:

- dense: ``{"cluster": {"chief": [...], "ps": [...], "worker": [...]}, "task": {"type":
  "ps", "index": 1}, "environment": "cloud"}``, every address
  ``<job>-<type>-<i>.<namespace>.svc[.<cluster domain>]:<port>``;
- sparse (``enableDynamicWorker``): ``{"cluster": {"worker": {...}, "ps": [...]}, "task":
  ...}``, where a worker's ``"worker"`` maps its own index to its address and a PS's
  ``"ps"`` list holds only its own address while ``task.index`` stays N.

:func:`cluster_from_tf_config` reads both into one cluster spec (a sparse job as
``{index: address}``, which ``tf.train.ClusterSpec`` accepts). Each of those names is a
headless Service that resolves only once its pod is Ready: a PS that binds its own name
waits for itself (and deadlocks with a readiness probe), so on Kubernetes the PS binds
its pod IP (``--bind-host $(POD_IP)``) or every interface. :func:`wait_resolvable` waits
for a name with a clear line, and gives up with :class:`NotResolvedError`, a transient
failure: the operator's ``ExitCode`` restart policy retries exit codes 128-255 and fails
the job on 1-127, so ``tictac ps`` exits :data:`EXIT_RETRY` for it and
:data:`EXIT_CONFIG` for a configuration error.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import sys
import time
from typing import Any, Callable, Mapping, TextIO

EXIT_CONFIG = 2     # permanent: the operator's ExitCode policy fails the job (1-127)
EXIT_RETRY = 203    # transient: 128 + EX_TEMPFAIL (75); the operator restarts the pod
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]")
_K8S_VARIABLE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_TF_CONFIG_FORM = ('TF_CONFIG must look like {"cluster": {"ps": [...], ...}, '
                   '"task": {"type": "ps", "index": 0}}')


class NotResolvedError(OSError):
    """A host name did not resolve in time: transient (retry later), not a mistake."""


def cluster_from_tf_config(tf_config: str | Mapping[str, Any] | None = None
                           ) -> tuple[dict[str, Any], str, int]:
    """(cluster spec, job name, task index) from TF_CONFIG (a JSON string or dict;
    default: the TF_CONFIG environment variable), dense or sparse (module docstring).
    Empty jobs are left out; a sparse job is ``{index: address}``."""
    if tf_config is None:
        tf_config = os.environ.get("TF_CONFIG")
        if not tf_config:
            raise ValueError("TF_CONFIG is not set; pass --cluster-spec and --task-index "
                             "or set TF_CONFIG to {\"cluster\": ..., \"task\": ...}")
    if isinstance(tf_config, str):
        try:
            tf_config = json.loads(tf_config)
        except json.JSONDecodeError as e:
            raise ValueError(f"TF_CONFIG is not valid JSON: {e}") from None
    try:
        cluster = dict(tf_config["cluster"])
        task = tf_config["task"]
        job, index = task["type"], int(task["index"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(_TF_CONFIG_FORM) from None
    sparse = any(isinstance(tasks, Mapping) for tasks in cluster.values())
    spec: dict[str, Any] = {}
    for name, tasks in cluster.items():
        if not tasks:
            continue  # the sparse form writes every job, even one this task does not see
        if isinstance(tasks, Mapping):
            try:
                tasks = {int(i): address for i, address in tasks.items()}
            except ValueError:
                raise ValueError(f"TF_CONFIG's job {name!r} maps task indices to "
                                 f"addresses; its keys are not all whole numbers: "
                                 f"{dict(tasks)!r}") from None
        elif sparse and name == job and len(tasks) == 1 and index >= 1:
            tasks = {index: tasks[0]}  # a sparse PS: only itself, at its own index
        spec[name] = tasks
    return spec, job, index


def unexpanded_variable(value: str, what: str) -> None:
    """Raises ValueError when ``value`` still holds a Kubernetes ``$(VAR)`` reference:
    Kubernetes leaves it as it is when the container defines no such variable."""
    m = _K8S_VARIABLE.search(value)
    if m:
        raise ValueError(
            f"{what} {value!r} holds the Kubernetes reference $({m.group(1)}), which was "
            f"not expanded: the container defines no environment variable {m.group(1)} "
            "before it (for the pod IP: env POD_IP with valueFrom.fieldRef.fieldPath "
            "status.podIP, listed before any variable that uses it)")


def is_address_literal(host: str) -> bool:
    """Whether ``host`` is an IP address (or a wildcard), which needs no resolving."""
    try:
        ipaddress.ip_address(host.strip("[]"))
        return True
    except ValueError:
        return False


def wait_resolvable(host: str, timeout_s: float, what: str, *, out: TextIO | None = None,
                    every_s: float = 10.0,
                    resolve: Callable[[str], Any] | None = None) -> float:
    """Waits until ``host`` resolves (getaddrinfo, as TensorFlow's gRPC does), saying so
    on ``out`` (default stderr) at once and every ``every_s`` seconds; returns the
    seconds waited. Raises :class:`NotResolvedError` after ``timeout_s``. An IP
    address returns at once."""
    if is_address_literal(host):
        return 0.0
    out = out or sys.stderr
    resolve = resolve or (lambda name: socket.getaddrinfo(name, None,
                                                          type=socket.SOCK_STREAM))
    start = time.monotonic()
    said = None
    while True:
        try:
            resolve(host)
            if said is not None:
                print(f"tictac ps: {host} resolves now, after "
                      f"{time.monotonic() - start:.1f} s", file=out, flush=True)
            return time.monotonic() - start
        except (socket.gaierror, UnicodeError) as e:
            why = getattr(e, "strerror", None) or str(e)
        waited = time.monotonic() - start
        if waited >= timeout_s:
            raise NotResolvedError(
                f"{what}: host {host!r} did not resolve within {timeout_s:g} s ({why}); "
                f"exiting with {EXIT_RETRY} so that Kubernetes retries. On Kubernetes a "
                "replica's name resolves only once its pod is Ready: bind the pod IP "
                "(--bind-host $(POD_IP)) or every interface (--bind-host 0.0.0.0)")
        if said is None or waited - said >= every_s:
            print(f"tictac ps: waiting for {what}'s host {host} to resolve ({why}; "
                  f"{waited:.0f} of {timeout_s:g} s)", file=out, flush=True)
            said = waited
        time.sleep(min(0.5, max(0.0, timeout_s - waited)))
