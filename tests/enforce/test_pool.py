"""enforce/pool.py: one client per PS, made at first use, made again after a failure."""

from __future__ import annotations

import threading

import pytest

from tictac_hooks.enforce.api import GateClient, GateError
from tictac_hooks.enforce.pool import GateClients


class Fake(GateClient):
    def __init__(self, address: str, fail: list[bool]) -> None:
        self.address, self.backend, self.closed, self._fail = address, "fake", False, fail

    def ping(self) -> bool:
        if self._fail and self._fail.pop(0):
            raise GateError(f"{self.address} went away")
        return True

    def close(self) -> None:
        self.closed = True


def test_one_client_per_ps_shared_and_made_again_after_a_gate_error():
    fail = [False, True]
    made: list[Fake] = []
    gates = GateClients(["a:1", "b:2"], lambda a, t: made.append(Fake(a, fail)) or made[-1])
    with gates.using("a:1") as c:
        assert c.ping()
    assert gates.client("a:1") is c and gates.made == 1  # shared
    with pytest.raises(GateError, match="went away"):
        with gates.using("a:1") as c2:
            c2.ping()
    assert c2.closed and gates.client("a:1") is not c2 and gates.made == 2  # reconnected
    gates.client("b:2")
    gates.close()
    assert all(c.closed for c in made[1:]) and gates.made == 3


def test_a_stale_drop_leaves_the_new_client_and_threads_get_one_client():
    made: list[Fake] = []
    gates = GateClients(["a:1"], lambda a, t: made.append(Fake(a, [])) or made[-1])
    old = gates.client("a:1")
    gates.drop("a:1")
    new = gates.client("a:1")
    gates.drop("a:1", old)  # another thread's late drop of the old one
    assert gates.client("a:1") is new and not new.closed
    gates.close()
    gates = GateClients(["a:1"], lambda a, t: made.append(Fake(a, [])) or made[-1])
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(gates.client("a:1")))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(c) for c in seen}) == 1 and gates.made == 1
