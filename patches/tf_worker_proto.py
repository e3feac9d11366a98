"""TensorFlow's own definition of ``RecvTensorRequest``, read from the installed wheel.

Tested on: tensorflow / tensorflow-cpu 2.16 - 2.21 (Linux x86_64 wheels).

Why this is a patch: the wheel ships descriptor sets for some of its protos
(``tensorflow/include/tensorflow/core/protobuf/for_core_protos-descriptor-set.proto.bin``)
but not for ``tensorflow/core/protobuf/worker.proto``, which defines the gRPC worker
service's messages, and no ``worker_pb2`` Python module. The C++ library does carry that
file's serialized ``FileDescriptorProto`` (protoc embeds it in every generated
``.pb.cc``). We find it in ``libtensorflow_cc.so.2`` (or ``libtensorflow_framework.so.2``)
and parse it with protobuf, so the field numbers and types come from TensorFlow itself,
not from our own copy. Only the scalar fields of ``RecvTensorRequest`` are kept (the
message-typed ones would drag in a dozen other files); the dropped fields stay in the
parsed message as unknown fields, and the rendezvous forwards the original bytes anyway.

If a TensorFlow release stops embedding the descriptor, or renames a field the
rendezvous reads, :func:`recv_tensor_request_class` raises :class:`TensorFlowProtoError`
and ``tests/enforce/test_patches.py`` fails.
"""

from __future__ import annotations

import functools
import importlib.util
import mmap
import os
from typing import Iterable

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

WORKER_PROTO = "tensorflow/core/protobuf/worker.proto"
# The fields the rendezvous reads, with their protobuf types; checked on load.
REQUIRED_FIELDS = {
    "step_id": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    "rendezvous_key": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
}
_LIBRARIES = ("libtensorflow_cc.so.2", "libtensorflow_framework.so.2",
              "libtensorflow_cc.2.dylib", "libtensorflow_framework.2.dylib")
# FileDescriptorProto field numbers (descriptor.proto), used only to find where the
# embedded message ends; the bytes are then parsed by protobuf itself.
_FILE_DESCRIPTOR_FIELDS = frozenset(range(1, 16))


class TensorFlowProtoError(RuntimeError):
    """TensorFlow's worker.proto definitions could not be read from the installed wheel."""


def tensorflow_dir() -> str:
    """The installed ``tensorflow`` package directory, found without importing TensorFlow."""
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        raise TensorFlowProtoError(
            "TensorFlow is not installed; install tensorflow-cpu or tensorflow "
            "(the rendezvous reads RecvTensorRequest's definition from it)")
    return list(spec.submodule_search_locations)[0]


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return result, pos


def _embedded_end(buf, start: int) -> int:
    """End of the serialized FileDescriptorProto that starts at ``start``: the first
    position where the bytes stop looking like its fields (protoc stores it as one
    contiguous char array)."""
    pos = start
    while pos < len(buf):
        tag, after = _varint(buf, pos)
        field, wire_type = tag >> 3, tag & 7
        if field not in _FILE_DESCRIPTOR_FIELDS or wire_type not in (0, 2):
            break
        if wire_type == 2:
            length, after = _varint(buf, after)
            after += length
        else:
            _, after = _varint(buf, after)
        if after > len(buf):
            break
        pos = after
    return pos


def find_file_descriptor(proto_path: str = WORKER_PROTO,
                         libraries: Iterable[str] | None = None) -> descriptor_pb2.FileDescriptorProto:
    """The ``FileDescriptorProto`` of ``proto_path`` as embedded in TensorFlow's library."""
    tf_dir = tensorflow_dir()
    name = proto_path.encode()
    # Field 1 (name), length-delimited, then field 2 (package) "tensorflow".
    needle = b"\n" + bytes([len(name)]) + name + b"\x12\x0atensorflow"
    searched = []
    for lib in libraries or _LIBRARIES:
        path = os.path.join(tf_dir, lib)
        if not os.path.exists(path):
            continue
        searched.append(path)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            start = buf.find(needle)
            while start >= 0:
                end = _embedded_end(buf, start)
                try:
                    fdp = descriptor_pb2.FileDescriptorProto.FromString(buf[start:end])
                except Exception:  # noqa: BLE001 - not the real one; keep looking
                    fdp = None
                if fdp is not None and fdp.name == proto_path and fdp.message_type:
                    return fdp
                start = buf.find(needle, start + 1)
    raise TensorFlowProtoError(
        f"could not find the definition of {proto_path} in TensorFlow's libraries "
        f"(searched {searched or 'none: no library found in ' + tf_dir}); this TensorFlow "
        "version is not supported by the TicTac rendezvous yet (see patches/tf_worker_proto.py)")


@functools.lru_cache(maxsize=None)
def recv_tensor_request_class():
    """A protobuf message class for ``tensorflow.RecvTensorRequest`` (scalar fields only)."""
    fdp = find_file_descriptor()
    message = next((m for m in fdp.message_type if m.name == "RecvTensorRequest"), None)
    if message is None:
        raise TensorFlowProtoError(f"{WORKER_PROTO} has no message RecvTensorRequest")
    scalar = descriptor_pb2.DescriptorProto(name=message.name)
    for field in message.field:
        if field.type not in (descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                              descriptor_pb2.FieldDescriptorProto.TYPE_GROUP,
                              descriptor_pb2.FieldDescriptorProto.TYPE_ENUM):
            scalar.field.add().CopyFrom(field)
    types = {f.name: f.type for f in scalar.field}
    for name, expected in REQUIRED_FIELDS.items():
        if types.get(name) != expected:
            raise TensorFlowProtoError(
                f"RecvTensorRequest.{name} in this TensorFlow is "
                f"{'missing' if name not in types else 'of another type'}; the TicTac "
                "rendezvous needs it (see patches/tf_worker_proto.py)")
    file = descriptor_pb2.FileDescriptorProto(
        name="tictac_hooks/tensorflow_worker_recv_tensor.proto", package=fdp.package,
        syntax=fdp.syntax or "proto3")
    file.message_type.add().CopyFrom(scalar)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"{fdp.package}.RecvTensorRequest"))
