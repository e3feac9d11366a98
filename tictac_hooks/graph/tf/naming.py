"""TensorFlow's names of tasks, transfers and parameter reads, as plain strings.

Pure string and struct functions: no TensorFlow is imported here, because the PS-side
Python gate (:mod:`tictac_hooks.enforce.gate`) and the HTTP/2 rendezvous parse every
rendezvous key with them.
"""

from __future__ import annotations

import re

# Op types whose output, on a PS, is a parameter sent to a worker (what TicTac orders):
# the ops that read a variable's value out of its resource (``ReadVariableOp``,
# ``ResourceGather``, ``ResourceGatherNd``: colocated with the variable, so on a PS
# they run there and their output is the tensor sent to the worker), and the variables
# themselves (``VariableV2``/``Variable`` reference variables, ``VarHandleOp``
# resource handles). The variables take no data inputs, so where an op must also take
# a PS variable's handle (the concrete-function extractor's recvs) only the reads match.
PARAMETER_READ_OPS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd",
                                "VariableV2", "Variable", "VarHandleOp"})

_EDGE_PREFIX = re.compile(r"^edge_\d+_")
_TASK = re.compile(r"/job:([^/]+)(?:/replica:\d+)?/task:(\d+)")


def task_of(device: str) -> str | None:
    """``"/job:ps/replica:0/task:1/device:CPU:0"`` -> ``"ps:1"``; None if no job/task."""
    m = _TASK.search(device or "")
    return f"{m.group(1)}:{m.group(2)}" if m else None


def sending_node_name(tensor_name: str) -> str:
    """``"edge_74_sequential/d1/MatMul/ReadVariableOp"`` -> the sending node's name."""
    return _EDGE_PREFIX.sub("", tensor_name, count=1)


def parse_rendezvous_key(key: str) -> tuple[str, str, str]:
    """(transfer name, destination device, full tensor name) of a rendezvous key
    ``src;incarnation;dst;edge_<n>_<name>;frame:iter``: the arguments of
    :meth:`Gate.arrive`."""
    parts = key.split(";")
    if len(parts) < 4:
        return key, "", ""
    return sending_node_name(parts[3]), parts[2], parts[3]
