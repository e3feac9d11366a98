// TensorFlow glue of the native gate: the server protocol "grpc+tictac" and the
// TictacControl op. This is the one file that reaches into TensorFlow's private C++
// server API (see patches/README.md); tested on TensorFlow 2.21 (CPU wheel), and
// tests/enforce/test_native.py fails loudly when the API it uses changes.
//
// - TicTacServer subclasses GrpcServer and hands Init a worker_func that builds a
//   TicTacWorker, the GrpcWorker whose virtual GrpcRecvTensorAsync gates the hand-back
//   of every RecvTensor response (paper section 5): the request goes straight to the
//   stock implementation with a wrapped `done`; the gate calls the real `done` (which
//   hands the response to gRPC) when the transfer's turn comes. A waiting transfer
//   holds its callback, no thread.
// - The factory accepts ServerDefs whose protocol is "grpc+tictac"; workers, chief and
//   coordinator keep "grpc" (the wire is the same).
// - TictacControl(verb, arg) runs a control verb (control.h) on the gate of the process
//   it runs in: place it on the PS device.
// - The listening address: GrpcServer::Init listens on "0.0.0.0:<port>", every
//   interface. TicTacServer listens on its own task's host from the cluster spec
//   instead (or $TICTAC_BIND_HOST), so a PS on 127.0.0.1 is not reachable from
//   another machine: it rewrites the builder's port entry in MaybeMutateBuilder.
#include <grpc/impl/grpc_types.h>
#include <grpcpp/server_builder.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "control.h"
#include "gate.h"
#include "tensorflow/core/distributed_runtime/rpc/grpc_server_lib.h"
#include "tensorflow/core/distributed_runtime/rpc/grpc_worker_service.h"
#include "tensorflow/core/distributed_runtime/server_lib.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/protobuf/worker.pb.h"

namespace tensorflow {
namespace {

constexpr char kProtocol[] = "grpc+tictac";

// Bytes of a serialized response. grpc::ByteBuffer::Length() calls
// grpc_byte_buffer_length, which the TensorFlow wheel does not export; ByteBuffer's one
// member is the grpc_byte_buffer* (grpcpp/support/byte_buffer.h), whose raw slice buffer
// carries the length (grpc/impl/grpc_types.h).
int64_t ResponseBytes(::grpc::ByteBuffer* response) {
  static_assert(sizeof(::grpc::ByteBuffer) == sizeof(grpc_byte_buffer*),
                "grpc::ByteBuffer layout changed: update ResponseBytes");
  grpc_byte_buffer* raw = *reinterpret_cast<grpc_byte_buffer**>(response);
  if (raw == nullptr || raw->type != GRPC_BB_RAW) return 0;
  return static_cast<int64_t>(raw->data.raw.slice_buffer.length);
}

// Whether a serialized RecvTensorResponse says is_dead (field 2, a varint): the exit
// iteration of a while loop sends every body transfer once more as a dead tensor.
// Walks the top-level fields across the raw slices without copying (the tensor, field
// 1, is skipped by its length); false for anything it cannot read.
bool ResponseIsDead(::grpc::ByteBuffer* response) {
  grpc_byte_buffer* raw = *reinterpret_cast<grpc_byte_buffer**>(response);
  if (raw == nullptr || raw->type != GRPC_BB_RAW) return false;
  const grpc_slice_buffer& sb = raw->data.raw.slice_buffer;
  size_t slice = 0, offset = 0;
  auto next_byte = [&](uint8_t* b) {
    while (slice < sb.count && offset >= GRPC_SLICE_LENGTH(sb.slices[slice])) {
      ++slice;
      offset = 0;
    }
    if (slice >= sb.count) return false;
    *b = GRPC_SLICE_START_PTR(sb.slices[slice])[offset++];
    return true;
  };
  auto varint = [&](uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!next_byte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  };
  auto skip = [&](uint64_t n) {
    while (n > 0 && slice < sb.count) {
      size_t left = GRPC_SLICE_LENGTH(sb.slices[slice]) - offset;
      size_t step = n < left ? static_cast<size_t>(n) : left;
      offset += step;
      n -= step;
      if (offset >= GRPC_SLICE_LENGTH(sb.slices[slice])) {
        ++slice;
        offset = 0;
      }
    }
    return n == 0;
  };
  for (int fields = 0; fields < 16; ++fields) {
    uint64_t tag, value;
    if (!varint(&tag)) return false;
    const uint64_t field = tag >> 3, wire = tag & 7;
    if (wire == 0) {
      if (!varint(&value)) return false;
      if (field == 2) return value != 0;  // RecvTensorResponse.is_dead
    } else if (wire == 2) {
      if (!varint(&value) || !skip(value)) return false;
    } else if (wire == 1) {
      if (!skip(8)) return false;
    } else if (wire == 5) {
      if (!skip(4)) return false;
    } else {
      return false;
    }
  }
  return false;
}

class TicTacWorker : public GrpcWorker {
 public:
  TicTacWorker(WorkerEnv* env, const ConfigProto& config, tictac::Gate* gate)
      : GrpcWorker(env, config), gate_(gate) {}

  void GrpcRecvTensorAsync(CallOptions* opts, const RecvTensorRequest* request,
                           ::grpc::ByteBuffer* response, StatusCallback done) override {
    if (gate_->Bypassed()) {  // a measurement setting: the stock path, untouched
      GrpcWorker::GrpcRecvTensorAsync(opts, request, response, std::move(done));
      return;
    }
    tictac::TicketPtr ticket = gate_->Arrive(request->step_id(), request->rendezvous_key());
    tictac::Gate* gate = gate_;
    GrpcWorker::GrpcRecvTensorAsync(
        opts, request, response,
        [gate, ticket, response, done = std::move(done)](const absl::Status& s) mutable {
          gate->Ready(ticket, s.ok() ? ResponseBytes(response) : 0,
                      s.ok() ? "" : std::string(s.message()),
                      [done = std::move(done), s]() mutable { done(s); },
                      s.ok() && ResponseIsDead(response));
        });
  }

 private:
  tictac::Gate* gate_;
};

// ServerBuilder keeps its listening ports in a private vector and has no accessor.
// An explicit template instantiation is the one place C++ lets code name a private
// member (access is not checked in its arguments); the friend it defines reads it.
// The layout is the one in the grpcpp headers TensorFlow ships, so it always matches.
template <auto Member>
struct BuilderPortsAccess {
  friend auto& BuilderPorts(::grpc::ServerBuilder& builder) { return builder.*Member; }
};
auto& BuilderPorts(::grpc::ServerBuilder& builder);
template struct BuilderPortsAccess<&::grpc::ServerBuilder::ports_>;

// The host part of "host:port" / "[v6]:port".
std::string HostOf(const std::string& address) {
  size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

class TicTacServer : public GrpcServer {
 public:
  TicTacServer(const ServerDef& server_def, Env* env)
      : GrpcServer(server_def, env), bind_host_(BindHost(server_def)) {}

  // Where this PS listens: $TICTAC_BIND_HOST if set, else its address's host in the
  // cluster spec ("" when the spec does not name it: TensorFlow's default then).
  static std::string BindHost(const ServerDef& def) {
    if (const char* env = std::getenv("TICTAC_BIND_HOST"); env != nullptr && *env) {
      return env;
    }
    for (const auto& job : def.cluster().job()) {
      if (job.name() != def.job_name()) continue;
      auto it = job.tasks().find(def.task_index());
      if (it != job.tasks().end()) return HostOf(it->second);
    }
    return "";
  }

  // (The GrpcServer constructor that takes a DeviceMgr is not exported; Init takes it.)
  absl::Status Init(DeviceMgr* local_device_mgr) {
    GrpcServerOptions opts;
    opts.local_device_mgr = local_device_mgr;
    opts.worker_func = [](WorkerEnv* env, const ConfigProto& config) {
      return std::unique_ptr<GrpcWorker>(
          new TicTacWorker(env, config, tictac::ServerGate()));
    };
    return GrpcServer::Init(opts);
  }

 protected:
  void MaybeMutateBuilder(::grpc::ServerBuilder* builder, int requested_port) override {
    if (bind_host_.empty()) return;
    const std::string wildcard = "0.0.0.0:" + std::to_string(requested_port);
    int rewritten = 0;
    for (auto& port : BuilderPorts(*builder)) {
      if (port.addr == wildcard) {
        port.addr = bind_host_ + ":" + std::to_string(requested_port);
        ++rewritten;
      }
    }
    if (rewritten == 0) {
      LOG(ERROR) << "tictac: GrpcServer::Init no longer adds " << wildcard
                 << " before MaybeMutateBuilder; this PS listens where TensorFlow chose, "
                    "not only on " << bind_host_;
    }
    tictac::SetBoundHost(rewritten ? bind_host_ : "*");
  }

 private:
  std::string bind_host_;
};

class TicTacServerFactory : public ServerFactory {
 public:
  bool AcceptsOptions(const ServerDef& server_def) override {
    return server_def.protocol() == kProtocol;
  }

  absl::Status NewServer(const ServerDef& server_def, const Options& options,
                         std::unique_ptr<ServerInterface>* out_server) override {
    if (tictac::ServerGate() == nullptr) {
      // One gate per process, for the life of the process (TF servers never stop).
      tictac::SetServerGate(new tictac::Gate());
    }
    std::unique_ptr<TicTacServer> server(
        new TicTacServer(server_def, Env::Default()));
    TF_RETURN_IF_ERROR(server->Init(options.local_device_mgr));
    *out_server = std::move(server);
    return absl::OkStatus();
  }
};

class Registrar {
 public:
  Registrar() { ServerFactory::Register("GRPC_TICTAC_SERVER", new TicTacServerFactory()); }
};
static Registrar registrar;

REGISTER_OP("TictacControl")
    .Input("verb: string")
    .Input("arg: string")
    .Output("reply: string")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc("Runs a TicTac control verb on the gate of the process it is placed in.");

class TictacControlOp : public OpKernel {
 public:
  explicit TictacControlOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& verb = ctx->input(0);
    const Tensor& arg = ctx->input(1);
    OP_REQUIRES(ctx, TensorShapeUtils::IsScalar(verb.shape()) &&
                         TensorShapeUtils::IsScalar(arg.shape()),
                errors::InvalidArgument("TictacControl takes two string scalars"));
    std::string reply;
    bool ok = tictac::Control(tictac::ServerGate(), std::string(verb.scalar<tstring>()()),
                              std::string(arg.scalar<tstring>()()), &reply);
    OP_REQUIRES(ctx, ok, errors::InvalidArgument(reply));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<tstring>()() = reply;
  }
};

REGISTER_KERNEL_BUILDER(Name("TictacControl").Device(DEVICE_CPU), TictacControlOp);

}  // namespace
}  // namespace tensorflow
