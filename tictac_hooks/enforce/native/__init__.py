"""The native gate: C++ sources (gate.h and its gate*.cc, with gate_internal.h: the gate
alone; control.cc: its control verbs; capi.cc: a C API; tf_server.cc: the grpc+tictac
server and the TictacControl op), built at first use against the installed TensorFlow
(build.py), controlled through TensorFlow's runtime (client.py) or ctypes in-process
(cgate.py)."""
