"""The op properties of paper Algorithm 1, over dependency classes.

For an op, ``dep`` is the set of recvs it depends on, directly or transitively. Ops with
the same ``dep`` have the same ``M`` and the same ``|dep ∩ R|`` for every outstanding
set R, so the properties are computed over the distinct dep sets ("classes") rather
than over ops: a ResNet-152 training graph of ~9,000 ops has only a few hundred. Each
class carries the summed compute time of its ops, which is all ``P`` needs.

With R the outstanding recvs (those not in R count as complete), for recv r:
  M(r)  = Time(r)                                   (op.M of a recv: its own transfer)
  P(r)  = sum of Time(op) over compute ops with dep ∩ R = {r}
  M+(r) = min op.M over ops with |dep ∩ R| > 1 and r in dep, where
          op.M = sum of Time(x) for x in dep ∩ R;   +inf where no such op exists.

See docs/ALGORITHMS.md, "Properties (Algorithm 1)".
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tictac_hooks.graph.dag import Graph, GraphError


def dependency_bitsets(graph: Graph) -> list[int]:
    """op index -> bitset (Python int) of the recvs it depends on; bit i = graph.recvs[i]."""
    recv_bit = {op.name: 1 << i for i, op in enumerate(graph.recvs)}
    deps: list[int] = []
    by_name: dict[str, int] = {}
    for op in graph.ops:  # topological order
        d = recv_bit.get(op.name, 0)
        for name in op.inputs:
            d |= by_name[name]
        by_name[op.name] = d
        deps.append(d)
    return deps


@dataclasses.dataclass
class DependencyClasses:
    """Compute ops grouped by dep set. ``member[k, i]``: class k depends on recv i."""

    member: np.ndarray        # (K, n) bool
    compute_time: np.ndarray  # (K,) summed Time of the class's compute ops
    recv_time: np.ndarray     # (n,) Time of each recv

    @classmethod
    def of(cls, graph: Graph, times: dict[str, float] | None = None) -> "DependencyClasses":
        """``times`` overrides op.time (e.g. the generic TIC oracle)."""
        def t(op):
            v = times[op.name] if times is not None else op.time
            if v is None:
                raise GraphError(
                    f"op {op.name!r} has no time: TAC needs a time oracle for every op "
                    "(measure one, give 'time' in the graph JSON, or use TIC)")
            return v

        n = len(graph.recvs)
        class_of: dict[int, int] = {}
        class_time: list[float] = []
        recv_names = {op.name for op in graph.recvs}
        for op, d in zip(graph.ops, dependency_bitsets(graph)):
            if op.name in recv_names or d == 0:
                continue  # recvs are not compute load; ops depending on no recv never matter
            k = class_of.setdefault(d, len(class_of))
            if k == len(class_time):
                class_time.append(0.0)
            class_time[k] += t(op)
        nbytes = (n + 7) // 8
        if class_of:
            packed = np.frombuffer(
                b"".join(d.to_bytes(nbytes, "little") for d in class_of), dtype=np.uint8)
            member = np.unpackbits(packed.reshape(len(class_of), nbytes), axis=1,
                                   bitorder="little")[:, :n].astype(bool)
        else:
            member = np.zeros((0, n), dtype=bool)
        return cls(member=member,
                   compute_time=np.asarray(class_time, dtype=np.float64),
                   recv_time=np.asarray([t(op) for op in graph.recvs], dtype=np.float64))


class OutstandingState:
    """Properties P, M and M+ of the outstanding recvs R, updated as recvs complete.

    Removing recv r touches only the classes that contain r: their count and M drop.
    P and M+ are then re-derived in O(K) and O(K * n) vectorised work.
    """

    def __init__(self, classes: DependencyClasses):
        self.c = classes
        n = classes.member.shape[1]
        self.outstanding = np.ones(n, dtype=bool)
        m = classes.member.astype(np.float64)
        self.count = classes.member.sum(axis=1).astype(np.int64)      # |dep ∩ R|
        self.load = m @ classes.recv_time                              # op.M
        self.index_sum = m @ np.arange(n, dtype=np.float64)            # names the single r
        # Classes whose count is <= 1 never contribute to M+ again (counts only fall).
        self._plus_rows = np.flatnonzero(self.count > 1)
        self._member_f32 = classes.member.astype(np.float32)  # for matrix-vector tests

    def complete(self, r: int) -> None:
        """Marks recv r as no longer outstanding (Algorithm 3: R <- R \\ {r})."""
        self.outstanding[r] = False
        col = self.c.member[:, r]
        self.count -= col
        self.load -= col * self.c.recv_time[r]
        self.index_sum -= col * float(r)
        rows = self._plus_rows
        self._plus_rows = rows[self.count[rows] > 1]

    def directly_dependent_load(self) -> np.ndarray:
        """P for every recv (0 for completed ones)."""
        single = np.flatnonzero(self.count == 1)
        owner = np.rint(self.index_sum[single]).astype(np.int64)
        return np.bincount(owner, weights=self.c.compute_time[single],
                           minlength=self.outstanding.size)

    def impending_comm_load(self, recvs: np.ndarray | None = None) -> np.ndarray:
        """M+ for every recv, or for the recv indices ``recvs`` only (+inf where no op
        depends on it and on another outstanding recv)."""
        rows = self._plus_rows
        width = self.outstanding.size if recvs is None else len(recvs)
        if rows.size == 0 or width == 0:
            return np.full(width, np.inf)
        member = self.c.member[rows] if recvs is None else self.c.member[np.ix_(rows, recvs)]
        return np.where(member, self.load[rows, None], np.inf).min(axis=0)

    def _rows_touching(self, recvs: np.ndarray) -> np.ndarray:
        """Indices of M+-relevant classes (count > 1) that contain any of ``recvs``."""
        indicator = np.zeros(self.outstanding.size, dtype=np.float32)
        indicator[recvs] = 1.0
        rows = self._plus_rows
        hits = self._member_f32[rows] @ indicator if rows.size < self.count.size // 2 \
            else (self._member_f32 @ indicator)[rows]
        return rows[hits > 0]

    def argmin_impending(self, recvs: np.ndarray) -> np.ndarray:
        """Positions in ``recvs`` whose M+ is the smallest among ``recvs`` (all of them
        when every M+ is inf). One matrix-vector product instead of M+ per recv."""
        rows = self._rows_touching(recvs)
        if rows.size == 0:
            return np.arange(len(recvs))
        best = self.load[rows].min()
        at_best = rows[self.load[rows] == best]
        return np.flatnonzero(self.c.member[np.ix_(at_best, recvs)].any(axis=0))

    def any_impending_below(self, recvs: np.ndarray, threshold: float) -> bool:
        """Whether any of ``recvs`` has M+ < ``threshold``."""
        rows = self._rows_touching(recvs)
        return bool(rows.size) and bool(self.load[rows].min() < threshold)


class JobState:
    """TAC's jobs (our extension of Algorithm 3; docs/ALGORITHMS.md, "TAC"), updated as
    recvs complete.

    One job per dependency class k with an outstanding recv: the recvs dep_k ∩ R, all of
    which op k waits for. With R the outstanding recvs:
      M(k) = op.M = sum of Time(x) for x in dep_k ∩ R
      P(k) = sum of compute_time(j) over classes j with an outstanding recv and
             dep_j ∩ R ⊆ dep_k ∩ R: the compute that can run once job k is in.
    A recv whose class is {r} is the paper's job (M(r), P(r)); Eq. 6 on recvs alone gives
    P = 0 to every recv that unlocks compute only together with others.

    ``diff[j, k] = |dep_j ∩ R \\ dep_k|`` is kept for all classes, so that completing r
    costs one decrement of the block (classes holding r) x (classes without it).
    """

    def __init__(self, classes: DependencyClasses):
        self.c = classes
        m = classes.member.astype(np.float32)
        self.count = classes.member.sum(axis=1).astype(np.int64)        # |dep_k ∩ R|
        self.load = m @ classes.recv_time                                # M(k)
        inter = np.rint(m @ m.T).astype(np.int32)                        # |dep_j ∩ dep_k|
        self.diff = self.count[:, None].astype(np.int32) - inter
        self.live = self.count > 0
        self.unlocked = classes.compute_time @ ((self.diff == 0) & self.live[:, None])  # P(k)
        self.outstanding = np.ones(classes.member.shape[1], dtype=bool)

    def complete(self, r: int) -> None:
        """Marks recv r as no longer outstanding (R <- R \\ {r})."""
        col = self.c.member[:, r]
        rows = np.flatnonzero(col & self.live)       # diff[j, k] drops for j holding r ...
        cols = np.flatnonzero(~col & self.live)      # ... and k without it
        if rows.size and cols.size:
            at = np.ix_(rows, cols)
            block = self.diff[at] - 1
            self.diff[at] = block
            self.unlocked[cols] += self.c.compute_time[rows] @ (block == 0)
        self.count[rows] -= 1
        self.load[rows] -= self.c.recv_time[r]
        done = rows[self.count[rows] == 0]          # their compute has run: in no job's P
        if done.size:
            self.unlocked[self.live] -= self.c.compute_time[done].sum()
            self.live[done] = False
        self.outstanding[r] = False

    def within(self, k: int) -> np.ndarray:
        """The jobs strictly inside job k (their recvs a proper subset of k's)."""
        return np.flatnonzero(self.live & (self.diff[:, k] == 0) & (self.count < self.count[k]))
