// The in-process TicTac gate; see gate.h for the semantics. This file: the gate's
// life, its settings, and the transfer path (a transfer's arrival, its response, its
// turn, skips). A channel's life is in gate_channels.cc, the paced service and the
// timer in gate_pacing.cc, the JSON it answers with in gate_records.cc.
#include "gate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>

#include "gate_internal.h"

namespace tictac {

Gate::Gate(Options options) : opt_(options) {
  std::random_device rd;
  char id[17];
  std::snprintf(id, sizeof id, "%08x%08x", rd(), rd());
  instance_ = id;
  timer_ = std::thread([this] { TimerLoop(); });
}

Gate::~Gate() {
  Runs runs;
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
    for (auto& [step, chans] : steps_)
      for (auto& [dest, ch] : chans)
        if (!ch->finished) Finish(ch.get(), &runs, "shutdown");
  }
  cv_.notify_all();
  timer_.join();
  RunAll(&runs);
}

double Gate::Now() const {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

void Gate::RunAll(Runs* runs) {
  for (auto& fn : *runs)
    if (fn) fn();
  runs->clear();
}

// -- schedules --------------------------------------------------------------------

std::string Gate::Install(const std::string& algorithm, const std::vector<Entry>& order,
                          std::string* error) {
  // The Schedule's own invariants (graph/schedule.py), checked again at the PS.
  std::unordered_set<std::string> names;
  int last = -1;
  const int n = static_cast<int>(order.size());
  for (const auto& [name, p] : order) {
    if (!names.insert(name).second) {
      *error = "schedule names transfer '" + name + "' more than once";
      return "";
    }
    if (p < 0 || p >= std::max(n, 1)) {
      *error = "priority of '" + name + "' must be an integer in [0, " + std::to_string(n) +
               "), got " + std::to_string(p);
      return "";
    }
    if (p < last) {
      *error = "the schedule is not sorted by priority at '" + name + "'";
      return "";
    }
    last = p;
  }
  std::lock_guard<std::mutex> l(mu_);
  std::unordered_set<std::string> expected;
  std::vector<std::string> unmatched;
  for (const auto& [name, p] : order) {
    if (whole_.empty() || served_.count(name)) expected.insert(name);
    else unmatched.push_back(name);
  }
  installed_ = Installed::Make(next_version_++, algorithm, order, expected);
  // A destination is restricted to what it was served once one of its steps is whole
  // (before that, half a step would leave the rest unexpected: it expects every name).
  served_at_install_.clear();
  for (const auto& [dest, whole] : whole_by_dest_)
    if (!whole.empty()) served_at_install_[dest] = served_by_dest_[dest];
  views_.clear();
  absent_streak_.clear();
  std::ostringstream o;
  o << "{\"version\":" << installed_->version << ",\"transfers\":" << order.size()
    << ",\"expected\":" << expected.size() << ",\"unmatched\":[";
  for (size_t i = 0; i < unmatched.size(); ++i) o << (i ? "," : "") << JsonStr(unmatched[i]);
  o << "],\"served\":" << served_.size() << "}";
  return o.str();
}

int64_t Gate::Clear() {
  std::lock_guard<std::mutex> l(mu_);
  installed_.reset();
  views_.clear();
  absent_streak_.clear();
  return next_version_++;
}

bool Gate::Configure(double skip_after_s, int presume_absent_after, std::string* error,
                     double pace_rate, int64_t pace_window, int align,
                     double conserve_after_s) {
  if (skip_after_s > 0 && !std::isfinite(skip_after_s)) {
    *error = "skip_after_s must be a finite number of seconds > 0";
    return false;
  }
  if (!std::isfinite(pace_rate)) {
    *error = "pace_rate must be a finite number of bytes per second >= 0 (0: no pacing)";
    return false;
  }
  std::lock_guard<std::mutex> l(mu_);
  if (skip_after_s > 0) opt_.skip_after_s = skip_after_s;
  if (presume_absent_after >= 0) opt_.presume_absent_after = presume_absent_after;
  if (pace_rate >= 0) opt_.pace_rate = pace_rate;
  if (pace_window >= 0) opt_.pace_window = pace_window;
  if (align >= 0 && opt_.align != (align != 0)) {
    opt_.align = align != 0;
    std::vector<Channel*> waiting;  // the eligible index's rank within a turn changes
    for (const auto& [at, ch] : behind_) waiting.push_back(ch);
    for (Channel* ch : waiting) Index(ch);
  }
  if (conserve_after_s > -1.5) opt_.conserve_after_s = conserve_after_s < 0 ? -1 : conserve_after_s;
  return true;
}

bool Gate::Size(int workers, double finish_after_s, double stale_after_s,
                std::string* error) {
  if (workers < 0 || workers > (1 << 20)) {
    *error = "workers must be a whole number in [1, 1048576], got " + std::to_string(workers);
    return false;
  }
  if ((finish_after_s > 0 && !std::isfinite(finish_after_s)) ||
      (stale_after_s > 0 && !std::isfinite(stale_after_s))) {
    *error = "finish_after_s and stale_after_s must be finite numbers of seconds > 0";
    return false;
  }
  std::lock_guard<std::mutex> l(mu_);
  if (workers > 0) {
    opt_.history = kRecordsPerWorker * workers;
    opt_.max_active_steps = kLiveStepsPerWorker * workers;
  }
  if (finish_after_s > 0) opt_.finish_after_s = finish_after_s;
  if (stale_after_s > 0) opt_.stale_after_s = stale_after_s;
  while (static_cast<int>(history_.size()) > opt_.history) history_.pop_front();
  return true;
}

// -- the transfer path --------------------------------------------------------------

TicketPtr Gate::Arrive(int64_t step_id, const std::string& rendezvous_key) {
  Key key = ParseRendezvousKey(rendezvous_key);
  key.dest = WorkerOf(key.dest);  // one worker is one task, whatever its device
  Runs runs;
  auto t = std::make_shared<Ticket>();
  t->step_id = step_id;
  t->dest = key.dest;
  t->name = key.name;
  {
    std::lock_guard<std::mutex> l(mu_);
    const double now = Now();
    const double steady = SteadyNow();
    Sweep(steady, false, &runs);
    t->t_arrive = now;
    // Each iteration of a loop is a training step of its own: the gate keys it apart
    // from the other iterations of the step id (one order per iteration).
    const int64_t step_key = (key.frame == 0 && key.iter == 0) ? step_id
                                                               : IterationKey(step_id, key);
    if (finished_.count(std::to_string(step_key) + "\n" + key.dest)) {
      // Its channel finished already: straight through, counted, never a new counter
      // at 0 that would wait on every name the step already had.
      totals_["after_finish"] += 1;
    } else {
      ArriveOn(GetChannel(step_key, step_id, key.dest, now, &runs), step_id, key, steady, t);
    }
  }
  RunAll(&runs);
  return t;
}

void Gate::ArriveOn(Channel* ch, int64_t step_id, const Key& key, double steady,
                    const TicketPtr& t) {
  ch->record_step_id = step_id;
  ch->frame = key.frame;
  ch->iter = key.iter;
  ch->t_last = steady;
  ch->inflight += 1;
  const bool room = served_.size() < opt_.max_served_names;
  std::string name = key.name;
  auto& by_dest = served_by_dest_[key.dest];
  if (!key.tensor.empty() && key.tensor != key.name) {
    // A tensor sent over two edges in one step arrives twice under one node name:
    // both full names count as served, and a schedule listing a full name orders
    // that copy by it.
    auto it = ch->tensors.emplace(key.name, key.tensor).first;
    if (it->second != key.tensor) {
      if (room) {
        served_.insert(it->second);
        served_.insert(key.tensor);
        by_dest.insert(it->second);
        by_dest.insert(key.tensor);
      }
      ch->served.insert(it->second);
      ch->served.insert(key.tensor);
    }
    if (ch->installed && ch->installed->priority.count(key.tensor)) name = key.tensor;
  }
  if (room) {
    served_.insert(name);
    by_dest.insert(name);
  }
  ch->served.insert(name);
  t->name = name;
  if (key.tensor != name) t->tensor = key.tensor;
  t->channel = ch;
  ch->all.push_back(t);
  const auto& in = ch->installed;
  auto p = in ? in->priority.find(name) : decltype(in->priority.end()){};
  if (in && p != in->priority.end()) {
    if (ch->arrived.count(name)) {
      t->state = State::kDuplicate;
    } else if (ch->done.count(name)) {
      t->state = State::kLate;
    } else {
      t->state = State::kListed;
      t->priority = p->second;
    }
    ch->arrived.insert(name);
  } else if (in && in->listed.count(name)) {
    t->state = State::kUnexpected;
  }
}

void Gate::Ready(const TicketPtr& t, int64_t nbytes, const std::string& error,
                 HandBack hand_back, bool dead) {
  Runs runs;
  {
    std::lock_guard<std::mutex> l(mu_);
    t->nbytes = nbytes;
    t->error = error;
    t->dead = dead;
    t->t_ready = Now();
    Channel* ch = t->channel;
    if (ch == nullptr || stopping_) {
      // Its channel finished before it (after_finish, or `early` says why): nothing to
      // order it against, but its bytes still share the link.
      t->t_handback = t->t_ready;
      Account(nbytes);
      runs.push_back(std::move(hand_back));
    } else {
      ch->inflight -= 1;
      ch->t_last = SteadyNow();
      t->hand_back = std::move(hand_back);
      if (t->state == State::kListed && ch->done.count(t->name))
        t->state = State::kLate;  // skipped while its response was being produced
      // Pacing: a transfer whose turn came waits in line with those of other
      // destinations, and ServePaced (in Pump) picks which goes.
      if (t->state != State::kListed || !error.empty() || dead ||
          (t->priority <= ch->counter && !Pacing())) {
        HandBackNow(ch, t, &runs);
      } else {
        t->seq = next_seq_++;
        t->t_wait = SteadyNow();
        ch->waiters.push_back(t);
        std::push_heap(ch->waiters.begin(), ch->waiters.end(), HeapLess);
        Index(ch);
      }
      Pump(ch, &runs);
    }
  }
  RunAll(&runs);
}

// -- the counter ------------------------------------------------------------------

void Gate::HandBackNow(Channel* ch, const TicketPtr& t, Runs* runs) {
  t->t_handback = Now();
  ch->t_last = SteadyNow();
  Account(t->nbytes);
  if (t->state == State::kListed) {
    t->rseq = next_seq_++;
    if (!ch->done.count(t->name)) {
      ch->done.insert(t->name);
      ch->counter += 1;
      Index(ch);
      absent_streak_.erase(ch->dest + "\n" + t->name);
    }
  }
  ch->handed.push_back(t);
  totals_[StateName(t->state)] += 1;
  runs->push_back(std::move(t->hand_back));
  t->hand_back = nullptr;
}

void Gate::HandBackFront(Channel* ch, Runs* runs) {
  std::pop_heap(ch->waiters.begin(), ch->waiters.end(), HeapLess);
  TicketPtr t = ch->waiters.back();
  ch->waiters.pop_back();
  Index(ch);
  if (t->state == State::kListed && ch->done.count(t->name)) t->state = State::kLate;
  HandBackNow(ch, t, runs);
}

void Gate::Skip(Channel* ch, const std::string& name, const char* reason) {
  ch->done.insert(name);
  ch->counter += 1;
  Index(ch);
  ch->skipped.push_back({name, reason, Now()});
  totals_["skipped"] += 1;
  if (!ch->arrived.count(name)) absent_streak_[ch->dest + "\n" + name] += 1;
}

void Gate::Pump(Channel* ch, Runs* runs) {
  const int before = ch->counter;
  while (true) {
    if (Pacing()) {
      ServePaced(runs);
    } else {
      while (!ch->waiters.empty() && ch->waiters.front()->priority <= ch->counter)
        HandBackFront(ch, runs);
    }
    if (ch->waiters.empty() || !opt_.presume_absent_after) break;
    const std::string* blocker = ch->NextMissing();
    if (blocker == nullptr || ch->arrived.count(*blocker)) break;
    auto it = absent_streak_.find(ch->dest + "\n" + *blocker);
    if (it == absent_streak_.end() || it->second < opt_.presume_absent_after) break;
    Skip(ch, *blocker, "absent");
  }
  if (!ch->waiters.empty()) {
    if (ch->deadline == 0 || ch->counter != before) Arm(ch);
  } else {
    Disarm(ch);
  }
}

void Gate::Arm(Channel* ch) {
  if (ch->deadline != 0) armed_.erase({ch->deadline, ch});
  ch->deadline = SteadyNow() + opt_.skip_after_s;
  armed_.emplace(ch->deadline, ch);
  cv_.notify_all();
}

void Gate::Disarm(Channel* ch) {
  if (ch->deadline != 0) armed_.erase({ch->deadline, ch});
  ch->deadline = 0;
}

void Gate::OnStall(Channel* ch, Runs* runs) {
  Disarm(ch);
  if (ch->waiters.empty()) return;
  if (ch->waiters.front()->priority <= ch->counter) {
    Arm(ch);  // its turn came: it waits for the link (pacing), not for a transfer
    return;
  }
  const std::string* blocker = ch->NextMissing();
  std::string name = blocker ? *blocker : ch->waiters.front()->name;
  Skip(ch, name, ch->arrived.count(name) ? "slow" : "timeout");
  Pump(ch, runs);
  if (!ch->waiters.empty() && ch->deadline == 0) Arm(ch);
}

}  // namespace tictac
