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
_LOWERED_BODY = re.compile(r"(^|/)body/_\d+/")
_TASK = re.compile(r"/job:([^/]+)(?:/replica:\d+)?/task:(\d+)")


def task_of(device: str) -> str | None:
    """``"/job:ps/replica:0/task:1/device:CPU:0"`` -> ``"ps:1"``; None if no job/task."""
    m = _TASK.search(device or "")
    return f"{m.group(1)}:{m.group(2)}" if m else None


def worker_of(device: str) -> str:
    """``"/job:worker/replica:0/task:3/device:GPU:1"`` -> ``"/job:worker/replica:0/task:3"``:
    one worker is one task, whatever device of it a read lands on
    (gate_channels.cc's ``WorkerOf``). A name without a device part is returned as it is."""
    at = device.find("/device:")
    return device if at < 0 else device[:at]


def sending_node_name(tensor_name: str) -> str:
    """``"edge_74_sequential/d1/MatMul/ReadVariableOp"`` -> the sending node's name."""
    return _EDGE_PREFIX.sub("", tensor_name, count=1)


def canonical_transfer_name(name: str) -> str:
    """A transfer's name with TensorFlow's numbering of a lowered loop body taken out:
    the PS serves ``while/body/_1/while/dense/MatMul/ReadVariableOp``, the extraction
    of the step function names that read ``while/body/while/dense/MatMul/ReadVariableOp``
    (one iteration of the loop, graph/tf/functions.py)."""
    return _LOWERED_BODY.sub(r"\1body/", sending_node_name(name))


def parse_rendezvous_key(key: str) -> tuple[str, str, str]:
    """(transfer name, destination device, full tensor name) of a rendezvous key
    ``src;incarnation;dst;edge_<n>_<name>;frame:iter``: the arguments of
    :meth:`Gate.arrive`."""
    parts = key.split(";")
    if len(parts) < 4:
        return key, "", ""
    return sending_node_name(parts[3]), parts[2], parts[3]


def rendezvous_key_frame(key: str) -> tuple[int, int]:
    """(frame id, iteration) of a rendezvous key's last field ``frame:iter``; (0, 0)
    outside loops or when the key has none. Inside a while loop (Keras's
    ``steps_per_execution > 1``) each iteration is a training step of its own."""
    parts = key.split(";")
    if len(parts) < 5:
        return 0, 0
    frame, _, iteration = parts[4].partition(":")
    try:
        return int(frame), int(iteration)
    except ValueError:
        return 0, 0


def is_dead_response(message: bytes | memoryview) -> bool:
    """Whether a serialized ``RecvTensorResponse`` has ``is_dead`` (field 2) set: the
    exit iteration of a loop sends every body transfer once more, dead. Reads the
    top-level fields only (the tensor, field 1, is skipped by its length); False for
    anything it cannot read. The C++ twin is tf_server.cc's ResponseIsDead."""
    data, pos, n = bytes(message[:64]), 0, len(message)

    def varint() -> int | None:
        nonlocal pos
        value = shift = 0
        while pos < len(data) and shift < 64:
            b = data[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
        return None

    for _ in range(16):
        if pos >= n or pos >= len(data):
            return False
        tag = varint()
        if tag is None:
            return False
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            value = varint()
            if value is None:
                return False
            if field == 2:
                return value != 0
        elif wire == 2:
            length = varint()
            if length is None:
                return False
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            return False
    return False
