"""The native gate's reach into TensorFlow's private C++ gRPC server API.

Tested on: tensorflow / tensorflow-cpu 2.21 (Linux x86_64 wheels, g++ 12).

The code is ``tictac_hooks/enforce/native/tf_server.cc``, kept beside the gate it drives
(it is compiled with it); this module is its pointer from ``patches/`` and the check
that the API it subclasses is still there. ``tf_server.cc`` relies on:

- ``GrpcServer(const ServerDef&, Env*)`` and ``GrpcServer::Init(const
  GrpcServerOptions&)`` (protected: subclassed), with ``GrpcServerOptions::worker_func``
  and ``local_device_mgr``;
- the virtual ``GrpcWorker::GrpcRecvTensorAsync(CallOptions*, const RecvTensorRequest*,
  ::grpc::ByteBuffer*, StatusCallback)``, whose ``done`` hands the response to gRPC;
- ``ServerFactory::Register`` / ``AcceptsOptions`` / ``NewServer(const ServerDef&, const
  Options&, std::unique_ptr<ServerInterface>*)``;
- ``grpc::ByteBuffer`` holding one ``grpc_byte_buffer*`` (its ``Length()`` calls a gRPC C
  symbol the wheel does not export; ``tf_server.cc`` reads the raw slice buffer's length
  and ``static_assert``s the layout).

:func:`check_headers` looks for each of these in the installed TensorFlow's headers and
raises :class:`TensorFlowServerApiError` naming what moved;
``tests/enforce/test_native.py`` runs it, then builds and loads the plugin, so an
upstream change fails there loudly rather than as an unordered PS.
"""

from __future__ import annotations

import os
import re

# (header under tensorflow/include, pattern that must match, what it is)
REQUIRED = (
    ("tensorflow/core/distributed_runtime/rpc/grpc_server_lib.h",
     r"GrpcServer\(const ServerDef& server_def, Env\* env\);", "GrpcServer(ServerDef, Env*)"),
    ("tensorflow/core/distributed_runtime/rpc/grpc_server_lib.h",
     r"absl::Status Init\(const GrpcServerOptions& opts", "GrpcServer::Init(options)"),
    ("tensorflow/core/distributed_runtime/rpc/grpc_server_lib.h",
     r"WorkerCreationFunction worker_func", "GrpcServerOptions::worker_func"),
    ("tensorflow/core/distributed_runtime/rpc/grpc_server_lib.h",
     r"DeviceMgr\* local_device_mgr = nullptr;", "GrpcServerOptions::local_device_mgr"),
    ("tensorflow/core/distributed_runtime/rpc/grpc_worker_service.h",
     r"virtual void GrpcRecvTensorAsync\(CallOptions\* opts,\s*const RecvTensorRequest\* request,"
     r"\s*::grpc::ByteBuffer\* response,\s*StatusCallback done\);",
     "virtual GrpcWorker::GrpcRecvTensorAsync"),
    ("tensorflow/core/distributed_runtime/server_lib.h",
     r"virtual absl::Status NewServer\(\s*const ServerDef& server_def, const Options& options,",
     "ServerFactory::NewServer(ServerDef, Options, out)"),
    ("tensorflow/core/distributed_runtime/server_lib.h",
     r"static void Register\(const std::string& server_type, ServerFactory\* factory\);",
     "ServerFactory::Register"),
    ("external/com_github_grpc_grpc/include/grpcpp/support/byte_buffer.h",
     r"grpc_byte_buffer\* buffer_;", "grpc::ByteBuffer's one member"),
)


class TensorFlowServerApiError(RuntimeError):
    """The installed TensorFlow's C++ server API is not the one tf_server.cc uses."""


def check_headers(include: str | None = None) -> None:
    if include is None:
        import tensorflow as tf
        include = tf.sysconfig.get_include()
    missing = []
    for header, pattern, what in REQUIRED:
        path = os.path.join(include, header)
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            missing.append(f"{what}: no header {header}")
            continue
        if not re.search(pattern, text):
            missing.append(f"{what}: not found in {header}")
    if missing:
        raise TensorFlowServerApiError(
            "this TensorFlow's C++ gRPC server API differs from the one the native gate "
            "was written for (2.21): " + "; ".join(missing) + ". Use `tictac ps --backend "
            "proxy` and report the TensorFlow version")
