// Emulated GPU compute (docs/EMULATION.md; tictac_hooks/bench/emulate.py): TictacDelay passes its inputs through after
// a given delay, costing wall time and no core, so that 16-32 emulated workers whose
// step computes for 100 ms fit on a 2-core machine.
//
// One timer thread per process holds a min-heap of deadlines and fires each op's done
// callback at its deadline; no thread sleeps per op (TensorFlow's POSIX
// Env::SchedClosureAfter starts a thread per call). Ops of one stream (by default the
// op's device: one worker's GPU) run one after the other, as kernels on one GPU stream:
// an op's delay starts when the stream is free, not when its inputs are ready, so a
// step's compute adds up to the sum of its ops' delays whatever the DAG's width. A step
// that is cancelled (a timeout, an aborted step) takes its pending ops out of the heap
// and finishes them Cancelled at once: nothing stays behind.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tictac {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kLaunchSlack = std::chrono::milliseconds(2);

// The process's one timer: deadlines in a min-heap, one thread that sleeps until the
// earliest and runs what is due outside the lock.
class DelayTimer {
 public:
  static DelayTimer& Get() {
    static DelayTimer* timer = new DelayTimer();  // never destroyed: ops may outlive main
    return *timer;
  }

  // Runs `fire` once `delay_s` has passed after `stream` is free; returns the entry's
  // id (for Cancel). The stream is busy until then.
  int64_t Add(const std::string& stream, double delay_s, std::function<void()> fire) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    auto& free_at = free_at_[stream];
    // A GPU's launch queue hides the host's latency between one kernel's end and the
    // next one's launch; here the executor starts the next op a little after the last
    // one's done: within kLaunchSlack of the stream coming free, the op starts where
    // the stream came free (a later start is a real wait, e.g. for a transfer).
    const auto start = now > free_at && now - free_at <= kLaunchSlack ? free_at
                                                                      : std::max(now, free_at);
    const auto deadline =
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay_s));
    free_at = deadline;
    const int64_t id = next_id_++;
    pending_.emplace(id, std::move(fire));
    heap_.emplace(deadline, id);
    if (!thread_started_) {
      thread_started_ = true;
      std::thread([this] { Loop(); }).detach();
    }
    cv_.notify_one();
    return id;
  }

  // Takes an entry out before it fires: true if it was still pending (then the caller
  // finishes its op), false if it already fired or was cancelled.
  bool Cancel(int64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.erase(id) == 0) return false;
    ++cancelled_;
    return true;
  }

  int64_t Pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(pending_.size());
  }
  int64_t Fired() {
    std::lock_guard<std::mutex> lock(mu_);
    return fired_;
  }
  int64_t Cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }

 private:
  using Entry = std::pair<Clock::time_point, int64_t>;

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      // (a cancelled entry stays in the heap until its deadline, then is dropped)
      while (!heap_.empty() && pending_.count(heap_.top().second) == 0) heap_.pop();
      if (heap_.empty()) {
        cv_.wait(lock);
        continue;
      }
      const auto due = heap_.top().first;
      if (Clock::now() < due) {
        cv_.wait_until(lock, due);
        continue;
      }
      std::vector<std::function<void()>> run;
      const auto now = Clock::now();
      while (!heap_.empty() && heap_.top().first <= now) {
        auto it = pending_.find(heap_.top().second);
        heap_.pop();
        if (it == pending_.end()) continue;
        run.push_back(std::move(it->second));
        pending_.erase(it);
        ++fired_;
      }
      lock.unlock();
      for (auto& f : run) f();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap_;
  std::unordered_map<int64_t, std::function<void()>> pending_;
  std::unordered_map<std::string, Clock::time_point> free_at_;  // stream -> busy until
  int64_t next_id_ = 1, fired_ = 0, cancelled_ = 0;
  bool thread_started_ = false;
};

using tensorflow::AsyncOpKernel;
using tensorflow::CancellationManager;
using tensorflow::CancellationToken;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;

REGISTER_OP("TictacDelay")
    .Input("inputs: T")
    .Output("outputs: T")
    .Attr("T: list(type) >= 1")
    .Attr("delay_ms: float")
    .Attr("grad_delay_ms: float = 0")
    .Attr("stream: string = ''")
    .Attr("key: int = 0")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Passes `inputs` through after `delay_ms` milliseconds of emulated compute on `stream`
(default: the op's device), using no core. `grad_delay_ms` is its gradient's delay
(tictac_hooks/bench/emulate.py). `key` tells apart ops that would otherwise be merged as
common subexpressions.
)doc");

class TictacDelayOp : public AsyncOpKernel {
 public:
  explicit TictacDelayOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    float ms = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("delay_ms", &ms));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("stream", &stream_));
    OP_REQUIRES(ctx, ms >= 0 && std::isfinite(ms),
                absl::InvalidArgumentError("TictacDelay: delay_ms must be >= 0"));
    delay_s_ = ms / 1e3;
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    for (int i = 0; i < ctx->num_inputs(); ++i) ctx->set_output(i, ctx->input(i));
    if (delay_s_ <= 0) {
      done();
      return;
    }
    const std::string stream = stream_.empty() ? ctx->device()->name() : stream_;
    CancellationManager* cm = ctx->cancellation_manager();
    if (cm == nullptr) {
      DelayTimer::Get().Add(stream, delay_s_, std::move(done));
      return;
    }
    // Exactly one of the timer and the cancellation finishes the op: the timer takes
    // the entry out of the heap before it fires, and Cancel succeeds only before that.
    struct State {
      std::mutex mu;
      int64_t id = -1;
      bool cancelled = false;
    };
    auto state = std::make_shared<State>();
    const CancellationToken token = cm->get_cancellation_token();
    const bool registered = cm->RegisterCallback(token, [state, ctx, done]() {
      int64_t id;
      {
        std::lock_guard<std::mutex> lock(state->mu);
        state->cancelled = true;
        id = state->id;
      }
      if (id >= 0 && DelayTimer::Get().Cancel(id)) {
        ctx->SetStatus(absl::CancelledError("TictacDelay: the step was cancelled"));
        done();
      }
    });
    if (!registered) {  // cancelled already
      ctx->SetStatus(absl::CancelledError("TictacDelay: the step was cancelled"));
      done();
      return;
    }
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->cancelled) {  // cancelled between the registration and now
      ctx->SetStatus(absl::CancelledError("TictacDelay: the step was cancelled"));
      done();
      return;
    }
    state->id = DelayTimer::Get().Add(stream, delay_s_, [cm, token, done]() {
      cm->DeregisterCallback(token);
      done();
    });
  }

 private:
  double delay_s_ = 0;
  std::string stream_;
};

REGISTER_KERNEL_BUILDER(Name("TictacDelay").Device(tensorflow::DEVICE_CPU), TictacDelayOp);

REGISTER_OP("TictacPayload")
    .Input("after: T")
    .Output("payload: dtype")
    .Attr("T: list(type) >= 1")
    .Attr("shape: shape")
    .Attr("dtype: type = DT_FLOAT")
    .Attr("key: int = 0")
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      tensorflow::PartialTensorShape shape;
      TF_RETURN_IF_ERROR(c->GetAttr("shape", &shape));
      tensorflow::shape_inference::ShapeHandle out;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shape, &out));
      c->set_output(0, out);
      return absl::OkStatus();
    })
    .Doc(R"doc(
A tensor of `shape` and `dtype` (zeros), once `after` is ready: an emulated gradient
of real size, made once per op and handed out again each step, so a push costs its
bytes on the wire and no compute on the worker.
)doc");

class TictacPayloadOp : public tensorflow::OpKernel {
 public:
  explicit TictacPayloadOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    tensorflow::PartialTensorShape shape;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shape", &shape));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dtype", &dtype_));
    OP_REQUIRES(ctx, shape.AsTensorShape(&shape_),
                absl::InvalidArgumentError("TictacPayload needs a fully defined shape"));
  }

  void Compute(OpKernelContext* ctx) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!made_) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(dtype_, shape_, &payload_));
      memset(payload_.data(), 0, payload_.TotalBytes());
      made_ = true;
    }
    // The kernel keeps a reference: no consumer can take the buffer over in place.
    ctx->set_output(0, payload_);
  }

 private:
  std::mutex mu_;
  tensorflow::TensorShape shape_;
  tensorflow::DataType dtype_;
  tensorflow::Tensor payload_;
  bool made_ = false;
};

REGISTER_KERNEL_BUILDER(Name("TictacPayload").Device(tensorflow::DEVICE_CPU), TictacPayloadOp);

}  // namespace
}  // namespace tictac

// For tests and the bench (ctypes on the loaded library): the timer's entries.
extern "C" {
int64_t tictac_delay_pending() { return tictac::DelayTimer::Get().Pending(); }
int64_t tictac_delay_fired() { return tictac::DelayTimer::Get().Fired(); }
int64_t tictac_delay_cancelled() { return tictac::DelayTimer::Get().Cancelled(); }
}
