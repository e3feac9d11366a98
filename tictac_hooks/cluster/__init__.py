"""The local test bed: PS clusters on one machine, on loopback or in network namespaces
behind links shaped with ``tc``.

- :mod:`~tictac_hooks.cluster.launcher`: :class:`LocalCluster`, the PS and worker tasks
  as processes, and the clients run beside them;
- :mod:`~tictac_hooks.cluster.netns`: :class:`ShapedNetwork`, one network namespace per
  host on a bridge, every link shaped;
- :mod:`~tictac_hooks.cluster.procs`: children that die with their parent, and the
  thread they are started from;
- :mod:`~tictac_hooks.cluster.cleanup`: the one registry that tears clusters and
  networks down at exit and on SIGINT/SIGTERM.

Public names, imported on first use: ``LocalCluster``, ``ClusterError``,
``ShapedNetwork``, ``NetworkError``, ``cluster_hosts``, ``free_port``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LocalCluster": "tictac_hooks.cluster.launcher",
    "ClusterError": "tictac_hooks.cluster.launcher",
    "ShapedNetwork": "tictac_hooks.cluster.netns",
    "NetworkError": "tictac_hooks.cluster.netns",
    "cluster_hosts": "tictac_hooks.cluster.netns",
    "free_port": "tictac_hooks.ports",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tictac_hooks.cluster' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
