// Control verbs; see control.h.
#include "control.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <sstream>

namespace tictac {

namespace {

std::atomic<Gate*> g_server_gate{nullptr};

// "key\tvalue" lines up to a line "order", then "name\tpriority" lines (install), or
// key/value lines alone (configure).
bool ParseLines(const std::string& arg, std::vector<std::pair<std::string, std::string>>* head,
                std::vector<Entry>* order, std::string* error) {
  std::istringstream in(arg);
  std::string line;
  bool in_order = false;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    if (!in_order && line == "order") {
      in_order = true;
      continue;
    }
    size_t tab = line.rfind('\t');
    if (tab == std::string::npos) {
      *error = "control line " + std::to_string(lineno) + " has no TAB: '" + line + "'";
      return false;
    }
    std::string key = line.substr(0, tab), value = line.substr(tab + 1);
    if (!in_order) {
      head->emplace_back(key, value);
      continue;
    }
    errno = 0;
    char* end = nullptr;
    long p = std::strtol(value.c_str(), &end, 10);
    if (errno || end == value.c_str() || *end != '\0' || p < 0 || p > (1L << 30)) {
      *error = "priority of '" + key + "' is not a whole number >= 0: '" + value + "'";
      return false;
    }
    order->emplace_back(key, static_cast<int>(p));
  }
  return true;
}

bool ParseDouble(const std::string& s, double* out) {
  char* end = nullptr;
  errno = 0;
  *out = std::strtod(s.c_str(), &end);
  return !errno && end != s.c_str() && *end == '\0' && std::isfinite(*out);
}

}  // namespace

Gate* ServerGate() { return g_server_gate.load(); }
void SetServerGate(Gate* gate) { g_server_gate.store(gate); }

namespace {
std::mutex g_bound_mu;
std::string g_bound_host;  // guarded by g_bound_mu

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}
}  // namespace

std::string BoundHost() {
  std::lock_guard<std::mutex> lock(g_bound_mu);
  return g_bound_host;
}
void SetBoundHost(const std::string& host) {
  std::lock_guard<std::mutex> lock(g_bound_mu);
  g_bound_host = host;
}

bool Control(Gate* gate, const std::string& verb, const std::string& arg,
             std::string* reply) {
  if (verb == "ping") {
    *reply = std::string("{\"ok\":true,\"backend\":\"native\",\"enforcing\":") +
             (gate && !gate->Bypassed() ? "true" : "false") +
             ",\"bypassed\":" + (gate && gate->Bypassed() ? "true" : "false") +
             ",\"pid\":" + std::to_string(getpid()) +
             ",\"listening\":" + JsonString(BoundHost()) + "}";
    return true;
  }
  if (gate == nullptr) {
    *reply = "this process loaded the TicTac library but runs no grpc+tictac server, so "
             "it cannot enforce an order; start the PS with `tictac ps` (protocol "
             "grpc+tictac)";
    return false;
  }
  std::vector<std::pair<std::string, std::string>> head;
  std::vector<Entry> order;
  if (verb == "bypass") {
    if (arg != "0" && arg != "1") {
      *reply = "bypass takes 1 (serve every RecvTensor as a plain PS, for a measurement) "
               "or 0 (through the gate), got '" + arg + "'";
      return false;
    }
    if (arg == "1") gate->Clear();  // a bypassed PS holds no order it would not follow
    gate->SetBypass(arg == "1");
    *reply = std::string("{\"bypassed\":") + (arg == "1" ? "true" : "false") + "}";
    return true;
  }
  if (verb == "install" && gate->Bypassed()) {
    *reply = "this PS's gate is bypassed (the `bypass 1` measurement setting), so it "
             "would not enforce the order; run the control verb `bypass 0` first";
    return false;
  }
  if (verb == "install" || verb == "configure") {
    if (!ParseLines(arg, &head, &order, reply)) return false;
    std::string algorithm = "file";
    double skip = -1, pace_rate = -1;
    int presume = -1;
    int64_t pace_window = -1;
    int align = -1;
    double conserve = -2, finish = -1, stale = -1;
    int workers = 0;
    for (const auto& [k, v] : head) {
      if (k == "algorithm") {
        algorithm = v;
      } else if (k == "skip_after_s") {
        if (!ParseDouble(v, &skip) || skip <= 0) {
          *reply = "skip_after_s must be a number of seconds > 0, got '" + v + "'";
          return false;
        }
      } else if (k == "presume_absent_after") {
        double d;
        if (!ParseDouble(v, &d) || d < 0 || d != std::floor(d)) {
          *reply = "presume_absent_after must be a whole number >= 0, got '" + v + "'";
          return false;
        }
        presume = static_cast<int>(d);
      } else if (k == "pace_rate") {
        if (!ParseDouble(v, &pace_rate) || pace_rate < 0) {
          *reply = "pace_rate must be a number of bytes per second >= 0, got '" + v + "'";
          return false;
        }
      } else if (k == "window_bytes") {  // in-process: the pacing window
        double d;
        if (!ParseDouble(v, &d) || d < 0 || d != std::floor(d)) {
          *reply = "window_bytes must be a whole number of bytes >= 0, got '" + v + "'";
          return false;
        }
        pace_window = static_cast<int64_t>(d);
      } else if (k == "align") {
        if (v != "0" && v != "1") {
          *reply = "align must be 1 (aligned pacing) or 0 (the destinations of a step one "
                   "after the other), got '" + v + "'";
          return false;
        }
        align = v == "1";
      } else if (k == "conserve_after_s") {
        if (v == "off") {
          conserve = -1;
        } else if (!ParseDouble(v, &conserve) || conserve < 0) {
          *reply = "conserve_after_s must be a number of seconds >= 0 (work conservation "
                   "on) or 'off', got '" + v + "'";
          return false;
        }
      } else if (k == "workers" && verb == "configure") {  // sizes the gate's bounds
        double d;
        if (!ParseDouble(v, &d) || d < 1 || d != std::floor(d) || d > (1 << 20)) {
          *reply = "workers must be a whole number in [1, 1048576], got '" + v + "'";
          return false;
        }
        workers = static_cast<int>(d);
      } else if ((k == "finish_after_s" || k == "stale_after_s") && verb == "configure") {
        double& bound = k == "finish_after_s" ? finish : stale;
        if (!ParseDouble(v, &bound) || bound <= 0) {
          *reply = k + " must be a number of seconds > 0, got '" + v + "'";
          return false;
        }
      } else {
        *reply = "unknown control setting '" + k + "'";
        return false;
      }
    }
    if ((skip > 0 || presume >= 0 || pace_rate >= 0 || pace_window >= 0 || align >= 0 ||
         conserve > -1.5) &&
        !gate->Configure(skip, presume, reply, pace_rate, pace_window, align, conserve))
      return false;
    if ((workers > 0 || finish > 0 || stale > 0) && !gate->Size(workers, finish, stale, reply))
      return false;
    if (verb == "configure") {
      *reply = gate->SummaryJson();
      return true;
    }
    std::string result = gate->Install(algorithm, order, reply);
    if (result.empty()) return false;
    *reply = result;
    return true;
  }
  if (verb == "clear") {
    *reply = "{\"version\":" + std::to_string(gate->Clear()) + "}";
    return true;
  }
  if (verb == "stats") {
    // "active" (the default) or "finished", then optionally " since=<seq>": the records
    // finished after record <seq> (see Gate::StatsJson).
    const size_t space = arg.find(' ');
    const std::string which = arg.substr(0, space);
    int64_t since = 0;
    if (space != std::string::npos) {
      const std::string rest = arg.substr(space + 1);
      double d;
      if (rest.compare(0, 6, "since=") != 0 || !ParseDouble(rest.substr(6), &d) || d < 0 ||
          d != std::floor(d) || d > 9.0e18) {
        *reply = "stats takes 'active' or 'finished', then optionally ' since=<the last_seq "
                 "of an earlier read, a whole number >= 0>', got '" + arg + "'";
        return false;
      }
      since = static_cast<int64_t>(d);
    }
    if (!which.empty() && which != "active" && which != "finished") {
      *reply = "stats takes 'active' or 'finished', then optionally ' since=<seq>', got '" +
               arg + "'";
      return false;
    }
    *reply = gate->StatsJson(which != "finished", since);
    return true;
  }
  if (verb == "served") {
    *reply = gate->ServedJson();
    return true;
  }
  *reply = "unknown control verb '" + verb + "'; try ping, install, clear, stats, served, "
           "configure, bypass";
  return false;
}

}  // namespace tictac
