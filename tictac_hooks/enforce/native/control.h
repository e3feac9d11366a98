// The control verbs of the in-process gate, shared by the TictacControl op (run on the
// PS device through TensorFlow's runtime) and the C API (capi.cc).
#ifndef TICTAC_ENFORCE_NATIVE_CONTROL_H_
#define TICTAC_ENFORCE_NATIVE_CONTROL_H_

#include <string>

#include "gate.h"

namespace tictac {

// Runs `verb` with `arg` on `gate` (nullptr: this process serves no grpc+tictac
// server). Returns true with the JSON reply in *reply, or false with an error message.
// Verbs: ping, install, clear, stats, served, configure; the argument formats are in
// control.cc and enforce/native/client.py.
bool Control(Gate* gate, const std::string& verb, const std::string& arg,
             std::string* reply);

// The gate of this process's grpc+tictac server: created with the server, nullptr
// before (tf_server.cc sets it; the C API reads it).
Gate* ServerGate();
void SetServerGate(Gate* gate);

// Where this process's grpc+tictac server listens: a host, "*" (every interface), or
// "" before the server started. Reported by the ping verb.
std::string BoundHost();
void SetBoundHost(const std::string& host);

}  // namespace tictac

#endif  // TICTAC_ENFORCE_NATIVE_CONTROL_H_
