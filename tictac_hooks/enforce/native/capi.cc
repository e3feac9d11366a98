// A C API over the gate for ctypes: the conformance tests drive a gate alone (built
// without TensorFlow), and a PS process reads or configures its server's gate.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "control.h"
#include "gate.h"

namespace {

std::mutex g_mu;
std::unordered_map<int64_t, tictac::TicketPtr> g_tickets;  // handles given to callers
int64_t g_next_id = 1;

char* Dup(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

}  // namespace

extern "C" {

void* tictac_gate_new(double skip_after_s, int presume_absent_after, int max_active_steps,
                      int history) {
  tictac::Options o;
  o.skip_after_s = skip_after_s;
  o.presume_absent_after = presume_absent_after;
  o.max_active_steps = max_active_steps;
  o.history = history;
  return new tictac::Gate(o);
}

void tictac_gate_delete(void* gate) { delete static_cast<tictac::Gate*>(gate); }

// The gate of this process's grpc+tictac server, or NULL.
void* tictac_server_gate() { return tictac::ServerGate(); }

// A control verb (control.h); *ok is 1 on success, else the reply is the error.
char* tictac_gate_control(void* gate, const char* verb, const char* arg, int* ok) {
  std::string reply;
  *ok = tictac::Control(static_cast<tictac::Gate*>(gate), verb, arg ? arg : "", &reply);
  return Dup(reply);
}

int64_t tictac_gate_arrive(void* gate, int64_t step_id, const char* key) {
  auto t = static_cast<tictac::Gate*>(gate)->Arrive(step_id, key);
  std::lock_guard<std::mutex> l(g_mu);
  g_tickets[g_next_id] = t;
  return g_next_id++;
}

typedef void (*tictac_handback_fn)(int64_t ticket, void* ctx);

// The response of `ticket` is ready; `fn(ticket, ctx)` runs when the gate hands it back.
// `dead`: the response is a dead tensor (a loop's exit iteration).
int tictac_gate_ready(void* gate, int64_t ticket, int64_t nbytes, const char* error,
                      tictac_handback_fn fn, void* ctx, int dead) {
  tictac::TicketPtr t;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_tickets.find(ticket);
    if (it == g_tickets.end()) return 0;
    t = it->second;
    g_tickets.erase(it);
  }
  static_cast<tictac::Gate*>(gate)->Ready(t, nbytes, error ? error : "",
                                          [fn, ticket, ctx] { fn(ticket, ctx); },
                                          dead != 0);
  return 1;
}

void tictac_free(char* s) { std::free(s); }

}  // extern "C"
