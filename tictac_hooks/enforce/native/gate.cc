// The in-process TicTac gate; see gate.h for the semantics.
#include "gate.h"

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>

namespace tictac {

const char* StateName(State s) {
  switch (s) {
    case State::kPass: return "pass";
    case State::kListed: return "listed";
    case State::kLate: return "late";
    case State::kUnexpected: return "unexpected";
    case State::kDuplicate: return "duplicate";
  }
  return "?";
}

std::string SendingNodeName(const std::string& tensor) {
  // "edge_<digits>_" prefix, as _EDGE_PREFIX in graph/tf/naming.py.
  if (tensor.compare(0, 5, "edge_") != 0) return tensor;
  size_t i = 5;
  while (i < tensor.size() && tensor[i] >= '0' && tensor[i] <= '9') ++i;
  if (i == 5 || i >= tensor.size() || tensor[i] != '_') return tensor;
  return tensor.substr(i + 1);
}

std::string WorkerOf(const std::string& device) {
  const size_t at = device.find("/device:");
  return at == std::string::npos ? device : device.substr(0, at);
}

// "/job:worker/replica:0/task:12" -> 12; -1 where the name has no task index.
int64_t TaskIndex(const std::string& worker) {
  const size_t at = worker.rfind("/task:");
  if (at == std::string::npos) return -1;
  int64_t n = 0;
  size_t i = at + 6;
  if (i >= worker.size() || !isdigit(static_cast<unsigned char>(worker[i]))) return -1;
  for (; i < worker.size() && isdigit(static_cast<unsigned char>(worker[i])); ++i)
    n = n * 10 + (worker[i] - '0');
  return n;
}

Key ParseRendezvousKey(const std::string& key) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t semi = key.find(';', start);
    parts.push_back(key.substr(start, semi == std::string::npos ? semi : semi - start));
    if (semi == std::string::npos) break;
    start = semi + 1;
  }
  if (parts.size() < 4) return {key, "", ""};
  Key out{SendingNodeName(parts[3]), parts[2], parts[3]};
  if (parts.size() >= 5) {  // "frame:iter", both decimal
    const std::string& fi = parts[4];
    size_t colon = fi.find(':');
    if (colon != std::string::npos) {
      out.frame = std::strtoull(fi.c_str(), nullptr, 10);
      out.iter = std::strtoll(fi.c_str() + colon + 1, nullptr, 10);
    }
  }
  return out;
}

namespace {

// A 64-bit key of (step_id, frame, iter): splitmix64 over the three, so the iterations
// of one step id get keys apart from each other and from other step ids.
int64_t IterationKey(int64_t step_id, const Key& key) {
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  uint64_t h = mix(static_cast<uint64_t>(step_id));
  h = mix(h ^ key.frame);
  h = mix(h ^ static_cast<uint64_t>(key.iter));
  return static_cast<int64_t>(h);
}

std::string JsonStr(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string JsonNum(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6f", x);
  return buf;
}

double SteadyNow() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool HeapLess(const TicketPtr& a, const TicketPtr& b) {  // min-heap on (priority, seq)
  return std::make_pair(a->priority, a->seq) > std::make_pair(b->priority, b->seq);
}

}  // namespace

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

  // One (step, worker) record: the fields of records/gate.py GateStep, TransferRecord and
  // SkipRecord, one meaning each (tests/test_records.py fails when they drift).
  std::string Record() const {
    std::ostringstream o;
    int64_t bytes = 0, violations = 0, reordered = 0;
    int highest = -1;
    double start = t_first, end = t_first;
    bool any = false;
    for (const auto& t : handed) {
      bytes += t->nbytes;
      if (t->state == State::kLate || t->state == State::kUnexpected) ++violations;
      if (t->state == State::kListed) {
        if (t->priority < highest) ++reordered;
        highest = std::max(highest, t->priority);
      }
      start = any ? std::min(start, t->t_arrive) : t->t_arrive;
      end = any ? std::max(end, t->t_handback) : t->t_handback;
      any = true;
    }
    o << "{\"step_id\":" << record_step_id << ",\"worker\":" << JsonStr(dest);
    if (frame != 0 || iter != 0) o << ",\"frame\":" << frame << ",\"iteration\":" << iter;
    o
      << ",\"schedule_version\":" << (installed ? std::to_string(installed->version) : "null")
      << ",\"algorithm\":" << (installed ? JsonStr(installed->algorithm) : "null")
      << ",\"complete\":" << (Complete() ? "true" : "false") << ",\"order\":[";
    for (size_t i = 0; i < handed.size(); ++i) o << (i ? "," : "") << JsonStr(handed[i]->name);
    // A name handed back twice (a tensor sent over two edges, recorded under its node)
    // says which edge each copy was: its full tensor name, so that the bytes the PS
    // serves each edge are known before any order names the edges.
    std::unordered_map<std::string, int> times_named;
    for (const auto& t : handed) times_named[t->name] += 1;
    o << "],\"transfers\":[";
    for (size_t i = 0; i < handed.size(); ++i) {
      const auto& t = *handed[i];
      o << (i ? "," : "") << "{\"name\":" << JsonStr(t.name)
        << ",\"state\":\"" << StateName(t.state) << "\",\"priority\":" << t.priority
        << ",\"bytes\":" << t.nbytes << ",\"arrive\":" << JsonNum(t.t_arrive)
        // This gate holds the response: it is released when it is handed back.
        << ",\"release\":" << JsonNum(t.t_handback) << ",\"release_seq\":" << t.rseq
        << ",\"handback\":" << JsonNum(t.t_handback) << ",\"ready\":" << JsonNum(t.t_ready);
      if (!t.error.empty()) o << ",\"error\":" << JsonStr(t.error);
      if (t.dead) o << ",\"dead\":true";
      if (*t.early) o << ",\"early\":\"" << t.early << "\"";
      if (!t.tensor.empty() && times_named[t.name] > 1) o << ",\"tensor\":" << JsonStr(t.tensor);
      o << "}";
    }
    o << "],\"bytes\":" << bytes << ",\"start\":" << JsonNum(start)
      << ",\"end\":" << JsonNum(end) << ",\"skipped\":[";
    for (size_t i = 0; i < skipped.size(); ++i)
      o << (i ? "," : "") << "{\"name\":" << JsonStr(skipped[i].name)
        << ",\"reason\":\"" << skipped[i].reason << "\",\"time\":" << JsonNum(skipped[i].time)
        << "}";
    o << "],\"skips\":" << skipped.size() << ",\"violations\":" << violations
      << ",\"reordered\":" << reordered << ",\"unlisted\":[";
    bool first = true;
    for (const auto& t : handed) {
      if (t->state == State::kPass && !(installed && installed->priority.count(t->name))) {
        o << (first ? "" : ",") << JsonStr(t->name);
        first = false;
      }
    }
    o << "]}";
    return o.str();
  }
};

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
  if (align >= 0) opt_.align = align != 0;
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

// -- pacing ----------------------------------------------------------------------------

double Gate::Backlog(double steady_now) {
  if (backlog_time_ > 0 && opt_.pace_rate > 0)
    backlog_bytes_ = std::max(0.0, backlog_bytes_ - opt_.pace_rate * (steady_now - backlog_time_));
  backlog_time_ = steady_now;
  return backlog_bytes_;
}

bool Gate::Paced() {
  if (opt_.pace_rate <= 0) return false;
  const double now = SteadyNow();
  const double over = Backlog(now) - static_cast<double>(opt_.pace_window);
  if (over <= 0) return false;
  WakeAt(now + over / opt_.pace_rate);
  return true;
}

void Gate::WakeAt(double steady_when) {
  if (pace_deadline_ == 0 || steady_when < pace_deadline_) {
    pace_deadline_ = steady_when;
    cv_.notify_all();
  }
}

bool Gate::Conserve(Runs* runs) {
  if (opt_.conserve_after_s < 0) return false;
  Channel* pick = nullptr;
  for (const auto& [at, ch] : waiting_) {  // earliest turn first
    if (pick != nullptr && ch->turn > pick->turn) break;
    if (pick == nullptr || ch->waiters.front()->priority - ch->counter <
                               pick->waiters.front()->priority - pick->counter)
      pick = ch;
  }
  if (pick == nullptr) return false;
  const double when =
      std::max(drain_at_, pick->waiters.front()->t_wait) + opt_.conserve_after_s;
  if (SteadyNow() < when) {
    WakeAt(when);
    return false;
  }
  totals_["out_of_turn"] += 1;
  HandBackFront(pick, runs);
  return true;
}

void Gate::ServePaced(Runs* runs) {
  while (!Paced()) {
    // The earliest turn with a transfer whose turn came; within it, aligned: the
    // destination furthest behind, else the lowest task (waiting_ is ordered by
    // (turn, task, step seq, destination)).
    Channel* best = nullptr;
    for (const auto& [at, ch] : waiting_) {
      if (best != nullptr && ch->turn > best->turn) break;
      if (ch->waiters.front()->priority > ch->counter) continue;
      if (best == nullptr || (opt_.align && ch->counter < best->counter)) best = ch;
    }
    if (best == nullptr) {
      if (Conserve(runs)) continue;
      return;
    }
    HandBackFront(best, runs);
  }
}

void Gate::HandBackFront(Channel* ch, Runs* runs) {
  std::pop_heap(ch->waiters.begin(), ch->waiters.end(), HeapLess);
  TicketPtr t = ch->waiters.back();
  ch->waiters.pop_back();
  Waiting(ch);
  if (t->state == State::kListed && ch->done.count(t->name)) t->state = State::kLate;
  HandBackNow(ch, t, runs);
}

void Gate::OnPace(Runs* runs) {
  pace_deadline_ = 0;
  if (Pacing()) ServePaced(runs);
  std::vector<Channel*> waiting;
  for (const auto& [at, ch] : waiting_) waiting.push_back(ch);
  for (Channel* ch : waiting)
    if (!ch->waiters.empty()) Pump(ch, runs);
}

void Gate::Waiting(Channel* ch) {
  const auto at = std::make_tuple(ch->turn, ch->task, ch->step_seq, ch->dest);
  if (ch->waiters.empty()) waiting_.erase(at);
  else waiting_.emplace(at, ch);
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
        Waiting(ch);
      }
      Pump(ch, &runs);
    }
  }
  RunAll(&runs);
}

// -- stats --------------------------------------------------------------------------

std::string Gate::SummaryLocked() {
  std::ostringstream o;
  o << "{\"backend\":\"native\",\"instance\":\"" << instance_ << "\",\"schedule_version\":"
    << (installed_ ? std::to_string(installed_->version) : "null")
    << ",\"algorithm\":" << (installed_ ? JsonStr(installed_->algorithm) : "null")
    << ",\"expected\":" << (installed_ ? installed_->size() : 0)
    << ",\"window_bytes\":" << (opt_.pace_rate > 0 ? opt_.pace_window : 0)
    << ",\"pace_rate\":" << JsonNum(opt_.pace_rate)
    << ",\"align\":" << (opt_.align ? "true" : "false")
    << ",\"conserve_after_s\":"
    << (opt_.conserve_after_s < 0 ? std::string("null") : JsonNum(opt_.conserve_after_s))
    << ",\"skip_after_s\":" << JsonNum(opt_.skip_after_s)
    << ",\"finish_after_s\":" << JsonNum(opt_.finish_after_s)
    << ",\"active_steps\":" << steps_.size() << ",\"history\":" << history_.size()
    << ",\"history_limit\":" << opt_.history
    << ",\"served_names\":" << served_.size() << ",\"totals\":{";
  bool first = true;
  for (const auto& [k, v] : totals_) {
    o << (first ? "" : ",") << JsonStr(k) << ":" << v;
    first = false;
  }
  o << "}}";
  return o.str();
}

std::string Gate::SummaryJson() {
  std::lock_guard<std::mutex> l(mu_);
  return SummaryLocked();
}

namespace {
// A record with its numbers in front: "{" + "\"seq\":..,\"worker_seq\":..," + the rest.
std::string Numbered(int64_t seq, int64_t worker_seq, const std::string& record) {
  return "{\"seq\":" + std::to_string(seq) + ",\"worker_seq\":" +
         std::to_string(worker_seq) + "," + record.substr(1);
}
}  // namespace

std::string Gate::StatsJson(bool include_active, int64_t since) {
  Runs runs;
  std::string s = StatsLocked(include_active, since, &runs);
  RunAll(&runs);  // what a stale channel still held, let go by the sweep
  return s;
}

std::string Gate::StatsLocked(bool include_active, int64_t since, Runs* runs) {
  std::lock_guard<std::mutex> l(mu_);
  Sweep(SteadyNow(), true, runs);  // every quiet channel's record is readable now
  std::string s = SummaryLocked();
  s.pop_back();  // the closing brace: append the cursor and the records
  // Records after `since` that are no longer held: from since + 1 up to the oldest held.
  const int64_t oldest = history_.empty() ? last_record_seq_ + 1 : history_.front().first;
  const int64_t dropped = std::max<int64_t>(0, oldest - 1 - std::max<int64_t>(since, 0));
  s += ",\"since\":" + std::to_string(since) + ",\"last_seq\":" +
       std::to_string(last_record_seq_) + ",\"dropped\":" + std::to_string(dropped) +
       ",\"steps\":[";
  bool first = true;
  auto it = std::lower_bound(
      history_.begin(), history_.end(), since + 1,
      [](const std::pair<int64_t, std::string>& r, int64_t seq) { return r.first < seq; });
  for (; it != history_.end(); ++it) {
    s += (first ? "" : ",") + it->second;
    first = false;
  }
  if (include_active) {
    // Active records have no seq yet (0); their worker_seq is the one they will finish
    // with (steps finish oldest first).
    std::unordered_map<std::string, int64_t> next;
    for (int64_t step : step_order_)
      for (const auto& [dest, ch] : steps_[step]) {
        if (ch->finished) continue;  // its record is in the history already
        auto n = next.emplace(dest, dest_records_.count(dest) ? dest_records_[dest] : 0).first;
        s += (first ? "" : ",") + Numbered(0, ++n->second, ch->Record());
        first = false;
      }
  }
  return s + "]}";
}

std::string Gate::ServedJson() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<std::string> names(served_.begin(), served_.end());
  std::sort(names.begin(), names.end());
  std::string s = "{\"names\":[";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? "," : "") + JsonStr(names[i]);
  return s + "]}";
}

// -- internals ------------------------------------------------------------------------

Channel* Gate::GetChannel(int64_t step_id, int64_t request_step_id, const std::string& dest,
                          double now, Runs* runs) {
  auto sit = steps_.find(step_id);
  if (sit == steps_.end()) {
    // A step binds to the schedule current at its first transfer (atomic install).
    sit = steps_.emplace(step_id, std::map<std::string, std::unique_ptr<Channel>>()).first;
    binding_[step_id] = installed_;
    step_seq_[step_id] = next_step_seq_++;
    if (step_order_.empty()) cv_.notify_all();  // the timer sweeps while steps live
    step_order_.push_back(step_id);
    // The memory bound only (sized with the workers, Size): a healthy cluster never
    // has this many steps live; what the oldest still holds goes now, marked evicted.
    while (static_cast<int>(step_order_.size()) > opt_.max_active_steps) {
      int64_t old = step_order_.front();
      step_order_.pop_front();
      for (auto& [d, ch] : steps_[old])
        if (!ch->finished) Finish(ch.get(), runs, "evicted");
      totals_["evicted_steps"] += 1;
      Retire(old);
    }
    sit = steps_.find(step_id);
  }
  auto& chans = sit->second;
  auto cit = chans.find(dest);
  if (cit == chans.end()) {
    const double steady = SteadyNow();
    Supersede(dest, request_step_id, runs);
    auto ch = std::make_unique<Channel>();
    ch->step_id = step_id;
    ch->step_seq = step_seq_[step_id];
    ch->turn = TurnOf(dest, steady);
    dest_opened_[dest] = Opened{steady, request_step_id, step_id};
    ch->task = TaskIndex(dest);
    ch->dest = dest;
    ch->installed = View(step_id, dest);
    ch->t_first = now;
    ch->t_last = SteadyNow();
    cit = chans.emplace(dest, std::move(ch)).first;
  }
  return cit->second.get();
}

void Gate::Retire(int64_t step_id) {
  steps_.erase(step_id);
  binding_.erase(step_id);
  step_seq_.erase(step_id);
}

void Gate::Sweep(double steady_now, bool force, Runs* runs) {
  if (!force && steady_now - last_sweep_ < opt_.finish_after_s / 4) return;
  last_sweep_ = steady_now;
  std::deque<int64_t> live;
  for (int64_t step : step_order_) {
    bool all_finished = true;
    for (auto& [dest, ch] : steps_[step]) {
      if (ch->finished) continue;
      const double quiet = steady_now - ch->t_last;
      if (ch->waiters.empty() && ch->inflight == 0 && quiet >= opt_.finish_after_s)
        Finish(ch.get(), runs, nullptr);
      else if (quiet >= opt_.stale_after_s)
        Finish(ch.get(), runs, "stale");
      else
        all_finished = false;
    }
    if (all_finished) Retire(step);
    else live.push_back(step);
  }
  step_order_.swap(live);
  // Finished channels are remembered for a late request while it can still come.
  const double keep = std::max(opt_.stale_after_s, 10 * opt_.finish_after_s);
  const size_t most = 4 * static_cast<size_t>(opt_.max_active_steps);
  while (!finished_order_.empty() && (finished_order_.size() > most ||
                                      steady_now - finished_order_.front().first > keep)) {
    finished_.erase(finished_order_.front().second);
    finished_order_.pop_front();
  }
}

std::shared_ptr<Installed> Gate::View(int64_t step_id, const std::string& dest) {
  const auto& bound = binding_[step_id];
  if (!bound) return nullptr;
  auto key = std::make_pair(bound->version, dest);
  auto it = views_.find(key);
  if (it != views_.end()) return it->second;
  if (views_.size() > 4096) views_.clear();  // (version, destination) pairs
  auto sit = served_at_install_.find(dest);
  static const std::unordered_set<std::string> kNone;
  auto view = bound->ForDestination(bound, sit == served_at_install_.end() ? kNone : sit->second);
  views_[key] = view;
  return view;
}

void Gate::Account(int64_t nbytes) {
  if (opt_.pace_rate > 0) {
    const double now = SteadyNow();
    backlog_bytes_ = Backlog(now) + nbytes;
    drain_at_ = now + backlog_bytes_ / opt_.pace_rate;
  }
}

void Gate::HandBackNow(Channel* ch, const TicketPtr& t, Runs* runs) {
  t->t_handback = Now();
  ch->t_last = SteadyNow();
  Account(t->nbytes);
  if (t->state == State::kListed) {
    t->rseq = next_seq_++;
    if (!ch->done.count(t->name)) {
      ch->done.insert(t->name);
      ch->counter += 1;
      absent_streak_.erase(ch->dest + "\n" + t->name);
    }
  }
  ch->handed.push_back(t);
  totals_[StateName(t->state)] += 1;
  runs->push_back(std::move(t->hand_back));
  t->hand_back = nullptr;
}

void Gate::Skip(Channel* ch, const std::string& name, const char* reason) {
  ch->done.insert(name);
  ch->counter += 1;
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
  ch->deadline = SteadyNow() + opt_.skip_after_s;
  armed_.insert(ch);
  cv_.notify_all();
}

void Gate::Disarm(Channel* ch) {
  ch->deadline = 0;
  armed_.erase(ch);
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

void Gate::Finish(Channel* ch, Runs* runs, const char* early) {
  Disarm(ch);
  // What it still holds goes now, in priority order, each marked with why; what is
  // still being produced goes when ready (Ready: no channel), marked the same.
  const char* why = early ? early : "stale";
  std::sort(ch->waiters.begin(), ch->waiters.end(),
            [](const TicketPtr& a, const TicketPtr& b) { return HeapLess(b, a); });
  for (auto& t : ch->waiters) {
    t->t_handback = Now();
    t->early = why;
    Account(t->nbytes);
    ch->handed.push_back(t);
    totals_[std::string("early_") + why] += 1;
    runs->push_back(std::move(t->hand_back));
    t->hand_back = nullptr;
  }
  ch->waiters.clear();
  Waiting(ch);
  for (auto& t : ch->all) {
    if (t->t_ready == 0) {  // in flight: its record says it went unordered
      t->early = why;
      ch->handed.push_back(t);
      totals_[std::string("early_") + why] += 1;
    }
    t->channel = nullptr;
  }
  ch->all.clear();
  ch->inflight = 0;  // what was in flight is in the record, marked early
  ch->finished = true;
  if (!early) Whole(ch);  // (a step let go early, e.g. superseded, may be half a step)
  const int64_t seq = ++last_record_seq_;
  history_.emplace_back(seq, Numbered(seq, ++dest_records_[ch->dest], ch->Record()));
  while (static_cast<int>(history_.size()) > opt_.history) history_.pop_front();
  std::string key = std::to_string(ch->step_id) + "\n" + ch->dest;
  if (finished_.insert(key).second) finished_order_.emplace_back(SteadyNow(), std::move(key));
}

// A worker runs one step at a time: when it begins another step while its previous one
// has held transfers here, quiet, for finish_after_s, it left that step (it was
// restarted, or the step was cancelled), so what that step holds goes now, marked
// superseded, instead of waiting for its turn (the earliest, being the oldest) and the
// skip bound. (A worker still in that step waits for what is held: it opens no other.)
void Gate::Supersede(const std::string& dest, int64_t step_id, Runs* runs) {
  auto last = dest_opened_.find(dest);
  if (last == dest_opened_.end()) return;
  auto sit = steps_.find(last->second.key);
  if (sit == steps_.end()) return;
  auto cit = sit->second.find(dest);
  if (cit == sit->second.end() || cit->second->finished) return;
  Channel* prev = cit->second.get();
  if (last->second.step_id != step_id && (!prev->waiters.empty() || prev->inflight > 0) &&
      SteadyNow() - prev->t_last >= opt_.finish_after_s) {
    totals_["superseded_steps"] += 1;
    Finish(prev, runs, "superseded");
  } else {
    Whole(prev);  // its worker went on to the next: that step (or iteration) is whole
  }
}

// An install restricts each destination's order to what it was served only once a
// step of it is whole (Install, View): half a step (a PS restarted mid-step, a worker's
// first step) would leave the rest of the step unexpected for as long as the install
// holds. A step is whole once it finished by itself or its worker opened its next one.
void Gate::Whole(Channel* ch) {
  auto& whole = whole_by_dest_[ch->dest];
  for (const auto& name : ch->served) {
    if (whole_.size() >= opt_.max_served_names) break;
    whole_.insert(name);
    whole.insert(name);
  }
  ch->served.clear();
}

// A channel's turn: how many channels its destination opened here before it, except
// for a worker that comes back (none opened for kRejoinAfterFinishes finish bounds):
// its turns start level with the fewest of its job's tasks that went on meanwhile, so
// it is served in turn from its first new step, not first for as many steps as it
// missed. Every PS sees the same gap and the same counts, so they still serve one
// worker order.
int64_t Gate::TurnOf(const std::string& dest, double steady) {
  int64_t& count = dest_turns_[dest];
  const double away = kRejoinAfterFinishes * opt_.finish_after_s;
  auto last = dest_opened_.find(dest);
  if (last != dest_opened_.end() && steady - last->second.at > away) {
    const std::string job = dest.substr(0, dest.find("/replica:"));
    int64_t level = -1;
    for (const auto& [other, opened] : dest_opened_) {
      if (other == dest || steady - opened.at > away || other.rfind(job + "/", 0) != 0)
        continue;  // (the same job: a chief's occasional reads count no turns)
      const int64_t n = dest_turns_[other];
      level = level < 0 ? n : std::min(level, n);
    }
    if (level > count) {
      totals_["rejoined"] += 1;
      count = level;
    }
  }
  return count++;
}

void Gate::TimerLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stopping_) {
    double next = pace_deadline_;
    for (Channel* ch : armed_)
      if (next == 0 || ch->deadline < next) next = ch->deadline;
    if (!step_order_.empty()) {  // quiet channels finish without waiting for a read
      const double sweep = last_sweep_ + opt_.finish_after_s / 4;
      if (next == 0 || sweep < next) next = sweep;
    }
    if (next == 0) {
      cv_.wait(l);
      continue;
    }
    double now = SteadyNow();
    if (next > now) {
      cv_.wait_for(l, std::chrono::duration<double>(next - now));
      continue;
    }
    Runs runs;
    if (pace_deadline_ != 0 && pace_deadline_ <= now) OnPace(&runs);
    std::vector<Channel*> due;
    for (Channel* ch : armed_)
      if (ch->deadline <= now) due.push_back(ch);
    for (Channel* ch : due)
      if (armed_.count(ch) && ch->deadline != 0 && ch->deadline <= now) OnStall(ch, &runs);
    Sweep(now, false, &runs);
    l.unlock();
    RunAll(&runs);
    l.lock();
  }
}

}  // namespace tictac
