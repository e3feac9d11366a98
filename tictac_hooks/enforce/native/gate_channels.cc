// The gate's channels (gate.h): which (step, destination, iteration) a rendezvous key
// names, and a channel's life: opened (its turn, the schedule view it enforces, the
// worker's previous step superseded or whole), finished (by itself, stale, evicted,
// superseded or at shutdown) and swept.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "gate.h"
#include "gate_internal.h"

namespace tictac {

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

// -- a channel's life --------------------------------------------------------------

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
    ch->turn = TurnOf(dest, step_id, steady);
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
  Index(ch);
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

// A channel's turn: the round its job is in (gate.h, "Which waiting transfer goes"):
// it joins the job's current round while another destination's channel of that round
// is still served here (a transfer held or in flight, or one its order lists still to
// come: a step's first requests may pass at once), else it begins the next one.
int64_t Gate::TurnOf(const std::string& dest, int64_t step, double steady) {
  Round& round = rounds_[dest.substr(0, dest.find("/replica:"))];
  bool joins = false;
  if (round.turn >= 0 && round.dests.count(dest) == 0) {
    // newest first: the channel most likely still served (O(1) in a round in flight)
    for (auto it = round.members.rbegin(); it != round.members.rend(); ++it) {
      const auto& [other, key] = *it;
      auto sit = steps_.find(key);
      if (sit == steps_.end()) continue;
      auto cit = sit->second.find(other);
      if (cit == sit->second.end()) continue;
      const Channel& ch = *cit->second;
      const bool serving = !ch.waiters.empty() || ch.inflight > 0 ||
                           (ch.installed && ch.done.size() < ch.installed->size());
      if (!ch.finished && serving) {
        joins = true;
        break;
      }
    }
  }
  if (!joins) {
    round.turn += 1;
    round.members.clear();
    round.dests.clear();
  }
  round.members.emplace_back(dest, step);
  round.dests.insert(dest);
  auto last = dest_opened_.find(dest);
  auto previous = dest_turns_.find(dest);
  if (last != dest_opened_.end() &&
      steady - last->second.at > kRejoinAfterFinishes * opt_.finish_after_s) {
    totals_["returned"] += 1;
    if (previous != dest_turns_.end() && previous->second + 1 != round.turn)
      totals_["rejoined"] += 1;
  }
  dest_turns_[dest] = round.turn;
  return round.turn;
}

}  // namespace tictac
