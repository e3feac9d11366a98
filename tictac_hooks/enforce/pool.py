"""One client per PS for everything a run asks its gates.

A run talks to every PS's gate for several reasons: the connect check (backend, ping),
installs and clears (the switch, the order check's blocks, a restarted PS), and the
record reads. :class:`GateClients` holds one long-lived :class:`GateClient` per PS for
all of them. A client whose call failed with :class:`GateError` is dropped and made
again at its next use, so a PS restarted at its address is reached again.

Example:
  gates = GateClients(["127.0.0.1:2222"], connect)   # enforce.client.connect
  with gates.using("127.0.0.1:2222") as client:
      client.ping()
  gates.close()
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator, Sequence

from tictac_hooks.enforce.api import GateClient, GateError


class GateClients:
    """One client per PS address, made at first use (thread-safe).

    Args:
      addresses: the PS addresses.
      connect: makes a client for an address and a timeout (enforce.client.connect).
      timeout_s: per control call.
    """

    def __init__(self, addresses: Sequence[str],
                 connect: Callable[[str, float], GateClient],
                 timeout_s: float = 10.0) -> None:
        self.addresses = list(addresses)
        self.timeout_s = timeout_s
        self._connect = connect
        self._clients: dict[str, GateClient] = {}
        self._lock = threading.Lock()
        self.made = 0  # clients made (one per PS, plus one per reconnection)

    def client(self, address: str) -> GateClient:
        """The PS's client, made if there is none (it may raise GateError)."""
        with self._lock:
            found = self._clients.get(address)
            if found is None:
                found = self._clients[address] = self._connect(address, self.timeout_s)
                self.made += 1
            return found

    @contextlib.contextmanager
    def using(self, address: str) -> Iterator[GateClient]:
        """The PS's client for one or more calls; a GateError among them drops it (the
        next use reconnects) and goes on up."""
        client = self.client(address)
        try:
            yield client
        except GateError:
            self.drop(address, client)
            raise

    def drop(self, address: str, client: GateClient | None = None) -> None:
        """Forgets the PS's client (only ``client``, when given) and closes it."""
        with self._lock:
            found = self._clients.get(address)
            if found is None or (client is not None and found is not client):
                return
            del self._clients[address]
        found.close()

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()
