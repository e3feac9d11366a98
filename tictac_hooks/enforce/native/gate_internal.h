// The gate's private parts, shared by its .cc files (gate.h is the public class): an
// installed schedule (Installed), the counter and records of one (step, destination)
// (Channel), and small helpers. gate.cc holds the transfer path, gate_channels.cc a
// channel's life (key, open, turn, supersede, finish, sweep), gate_pacing.cc the paced
// service and the timer, gate_records.cc the JSON the gate answers with.
#ifndef TICTAC_ENFORCE_NATIVE_GATE_INTERNAL_H_
#define TICTAC_ENFORCE_NATIVE_GATE_INTERNAL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gate.h"

namespace tictac {

// A 64-bit key of (step_id, frame, iter): the iterations of one step id get keys apart
// from each other and from other step ids (gate_channels.cc).
int64_t IterationKey(int64_t step_id, const Key& key);

std::string JsonStr(const std::string& s);  // a JSON string literal of s
std::string JsonNum(double x);              // "%.6f", "null" when not finite
// A record with its gate-wide and per-destination numbers in front.
std::string Numbered(int64_t seq, int64_t worker_seq, const std::string& record);

inline double SteadyNow() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

// min-heap on (priority, seq)
inline bool HeapLess(const TicketPtr& a, const TicketPtr& b) {
  return std::make_pair(a->priority, a->seq) > std::make_pair(b->priority, b->seq);
}

// One installed schedule, restricted to the transfers a PS (or one destination) serves.
struct Installed {
  int64_t version = 0;
  std::string algorithm;
  std::vector<Entry> schedule;                   // as installed, sorted by priority
  std::unordered_set<std::string> listed;        // every name the schedule gives
  std::unordered_set<std::string> expected;      // the ones enforced here
  std::unordered_map<std::string, int> priority;  // local priority of each expected
  std::vector<std::string> names_by_priority;

  static std::shared_ptr<Installed> Make(int64_t version, const std::string& algorithm,
                                         const std::vector<Entry>& schedule,
                                         const std::unordered_set<std::string>& expected) {
    auto in = std::make_shared<Installed>();
    in->version = version;
    in->algorithm = algorithm;
    in->schedule = schedule;
    in->expected = expected;
    // Local priority: how many expected transfers have a strictly smaller priority
    // (competition rank; ties stay ties), so the global [0, n) numbers work on a PS
    // serving a subset (Schedule.restricted).
    int below = 0, prev = -1;
    for (const auto& [name, p] : schedule) {
      in->listed.insert(name);
      if (!expected.count(name)) continue;
      int i = static_cast<int>(in->names_by_priority.size());
      if (i && p != prev) below = i;
      prev = p;
      in->priority[name] = below;
      in->names_by_priority.push_back(name);
    }
    return in;
  }

  size_t size() const { return names_by_priority.size(); }

  // The view one destination enforces: only what this PS has served to it (the counter
  // is per (step, destination), so a destination must not wait for transfers that only
  // other destinations receive). A destination that was served none of the listed
  // transfers yet enforces the whole schedule.
  std::shared_ptr<Installed> ForDestination(const std::shared_ptr<Installed>& self,
                                            const std::unordered_set<std::string>& served) {
    std::unordered_set<std::string> mine;
    for (const auto& n : expected)
      if (served.count(n)) mine.insert(n);
    if (mine.empty() || mine.size() == expected.size()) return self;
    return Make(version, algorithm, schedule, mine);
  }
};

// The counter and records of one (step_id, destination device, loop iteration).
struct Channel {
  int64_t step_id = 0;  // the gate's key of the step: step_id, or one per iteration
  int64_t step_seq = 0;  // the step's arrival number at this gate
  int64_t turn = 0;      // channels its destination opened at this gate before it
  int64_t task = 0;      // the destination's task index (the paced service's order)
  int64_t record_step_id = 0;  // the request's step_id
  uint64_t frame = 0;
  int64_t iter = 0;
  std::string dest;
  std::shared_ptr<Installed> installed;
  int counter = 0;
  std::vector<TicketPtr> waiters;  // ready, waiting for their turn (a heap)
  std::unordered_set<std::string> done;     // expected names handed back or skipped
  std::unordered_set<std::string> arrived;  // listed names whose request came
  size_t cursor = 0;                        // into installed->names_by_priority
  std::vector<TicketPtr> handed;            // in hand-back order
  struct Skipped {
    std::string name, reason;
    double time;
  };
  std::vector<Skipped> skipped;
  std::vector<TicketPtr> all;  // every ticket, detached when the channel finishes
  std::unordered_map<std::string, std::string> tensors;  // node -> first tensor name
  std::unordered_set<std::string> served;  // names it served (the gate's once finished)
  double deadline = 0;  // steady clock; 0: no timer
  // Its entries in the gate's eligible_ and behind_ (Gate::Index), where it has them.
  std::optional<PaceKey> eligible_at, behind_at;
  double t_first = 0;
  double t_last = 0;    // steady clock: its last arrival, response or hand-back
  int inflight = 0;     // arrived, response not produced yet
  bool finished = false;

  // Every expected transfer handed back or skipped, nothing held, in flight or let go
  // out of its order (records/gate.py GateStep.complete).
  bool Complete() const {
    if (!waiters.empty() || inflight > 0) return false;
    for (const auto& t : handed)
      if (*t->early) return false;
    return !installed || done.size() >= installed->size();
  }

  const std::string* NextMissing() {
    if (!installed) return nullptr;
    const auto& names = installed->names_by_priority;
    while (cursor < names.size() && done.count(names[cursor])) ++cursor;
    return cursor < names.size() ? &names[cursor] : nullptr;
  }

  // One (step, worker) record as JSON (gate_records.cc).
  std::string Record() const;
};

}  // namespace tictac

#endif  // TICTAC_ENFORCE_NATIVE_GATE_INTERNAL_H_
