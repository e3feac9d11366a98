// What the gate answers with (gate.h, StatsJson): a (step, worker) record as JSON
// (Channel::Record), the summary, a cursor's read of the history, the served names.
// The fields are records/gate.py's, one meaning each (tests/test_records.py).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <unordered_map>

#include "gate.h"
#include "gate_internal.h"

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

// A record with its numbers in front: "{" + "\"seq\":..,\"worker_seq\":..," + the rest.
std::string Numbered(int64_t seq, int64_t worker_seq, const std::string& record) {
  return "{\"seq\":" + std::to_string(seq) + ",\"worker_seq\":" +
         std::to_string(worker_seq) + "," + record.substr(1);
}

// One (step, worker) record: the fields of records/gate.py GateStep, TransferRecord and
// SkipRecord, one meaning each (tests/test_records.py fails when they drift).
std::string Channel::Record() const {
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
  o << "{\"step_id\":" << record_step_id << ",\"worker\":" << JsonStr(dest)
    << ",\"turn\":" << turn;
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

}  // namespace tictac
