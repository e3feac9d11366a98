"""The proxy backend: the TicTac rendezvous, an HTTP/2 frame-level interposer in front
of one TensorFlow server, plus its control service on the same port.

TensorFlow's gRPC connections pass through it without being terminated: every byte the
worker sends reaches the PS and every byte the PS sends reaches the worker, unchanged
and in the same order, so metadata, deadlines, status codes and details, message sizes
and streams are whatever the two ends say (nothing is re-encoded). Of the
``/tensorflow.WorkerService/RecvTensor`` requests it holds back the DATA frames (never
HEADERS) until the :class:`~tictac_hooks.enforce.gate.Gate` says it is the transfer's
turn. No thread waits per transfer. Measured: benchmarks/RESULTS.md.

Modules, each importing only the ones above it:

- ``h2``: HTTP/2 constants, frame-header helpers, HPACK decoding of request header
  blocks with its cache (:class:`RequestPaths`).
- ``pipes``: the socket pumps (``_Pipe``, zero-copy forwarding with backpressure) and
  socket helpers (connect, listen).
- ``scanner``: the request scanner (client -> upstream) and the holding of RecvTensor
  request DATA.
- ``connection``: one proxied connection: routing on its first request, the response
  watcher, closing.
- ``control``: the control service (``/tictac.Rendezvous/*`` verbs, ``CONTROL_PREFIX``).
- ``server``: :class:`Rendezvous` (listening, gate, routing policy, control server)
  and :class:`RendezvousThread`.
"""

from tictac_hooks.enforce.proxy.control import CONTROL_PREFIX, CONTROL_SERVICE
from tictac_hooks.enforce.proxy.h2 import EMPTY_SETTINGS, PREFACE, RECV_TENSOR, RequestPaths
from tictac_hooks.enforce.proxy.server import Rendezvous, RendezvousThread, recv_tensor_parser

__all__ = ["CONTROL_PREFIX", "CONTROL_SERVICE", "EMPTY_SETTINGS", "PREFACE", "RECV_TENSOR",
           "Rendezvous", "RendezvousThread", "RequestPaths", "recv_tensor_parser"]
