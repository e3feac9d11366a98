"""What one run is built from: every setting under one name, resolved once.

The Keras callback, the custom-loop API, the SessionRunHook, a restored order and the
absl flags all reach the engine through one frozen :class:`RunConfig`: the user's
settings (:class:`Settings`: argument, else ``--tictac_*`` flag, else default), the
cluster's addresses, and what the frontend knows of its steps. The engine reads each
value from here and nowhere else; in particular the link rate is ``bandwidth``
whether the order was switched or restored after a restart (it paces the gates and
times TAC's recvs).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from tictac_hooks.run.settings import Settings

# settings.align -> whether the paced service is aligned; "auto" resolves by training.
_ALIGN = {"on": True, "off": False}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One run's configuration (see the module docstring).

    Attributes:
      settings: the resolved user settings.
      ps_addresses: the cluster's PS addresses, in task order.
      bandwidth: a PS link's rate in bytes/s: the native gate paces each PS's egress at
        it (unless ``pace`` is False) and TAC times a recv as bytes / bandwidth; None:
        not paced, recvs timed from the fastest link rate measured while profiling.
      pace: whether the gates pace at ``bandwidth`` (the bench's unpaced variants).
      align: the paced service shares a PS link among a step's workers aligned (the
        k-th transfer to every worker before any (k+1)-th) or one worker after the
        other: ``settings.align`` "on"/"off", and for "auto" aligned unless training.
      training: whether the steps train.
      install: whether this process installs orders (the chief does).
      destination_jobs: the jobs whose steps are scheduled and reported.
      worker_addresses: task ("worker:1") -> its address, to tell a dead worker from a
        slow one.
      spread_over: the workers the loop's dispatched steps go to (CheckPlan.workers).
      poll_every: read records every this many steps (None: as the gates' history
        needs, and at epoch ends).
      background_switch: the switch runs on a thread of its own (the Keras callback).
    """

    settings: Settings
    ps_addresses: tuple[str, ...]
    bandwidth: float | None = None
    pace: bool = True
    align: bool | None = None
    training: bool = True
    install: bool = True
    destination_jobs: tuple[str, ...] = ("worker",)
    worker_addresses: tuple[tuple[str, str], ...] = ()
    spread_over: int = 1
    poll_every: int | None = None
    background_switch: bool = False

    def __post_init__(self) -> None:
        if self.bandwidth is not None and not (isinstance(self.bandwidth, (int, float))
                                               and math.isfinite(self.bandwidth)
                                               and self.bandwidth > 0):
            raise ValueError(f"bandwidth must be a finite number of bytes per second "
                             f"> 0, or None; got {self.bandwidth!r}")
        if self.spread_over < 1:
            raise ValueError(f"spread_over must be >= 1, got {self.spread_over!r}")

    @classmethod
    def build(cls, settings: Settings, ps_addresses: Sequence[str], *,
              bandwidth: float | None = None, training: bool = True, install: bool = True,
              destination_jobs: Sequence[str] = ("worker",),
              worker_addresses: Mapping[str, str] | None = None, spread: bool = True,
              poll_every: int | None = None, background_switch: bool = False,
              pace: bool = True, align: bool | None = None) -> "RunConfig":
        """The config a frontend builds; ``spread``: the dispatched steps go to every
        worker of ``worker_addresses`` (False: to one, as Keras predict's);
        ``align``: overrides the settings' (the bench's variants)."""
        workers = tuple(sorted(dict(worker_addresses or {}).items()))
        return cls(settings=settings, ps_addresses=tuple(ps_addresses),
                   bandwidth=None if bandwidth is None else float(bandwidth),
                   pace=pace,
                   align=align if align is not None else
                   _ALIGN.get(settings.align, not training),
                   training=training, install=install,
                   destination_jobs=tuple(destination_jobs), worker_addresses=workers,
                   spread_over=max(1, len(workers)) if spread else 1,
                   poll_every=poll_every, background_switch=background_switch)

    @property
    def pace_rate(self) -> float | None:
        """What the gates' install is given: ``bandwidth`` when pacing, 0 when pacing
        is off on purpose, None when no rate is known (the backend's own behaviour)."""
        if not self.pace:
            return 0.0
        return self.bandwidth

    def fields(self) -> dict[str, Any]:
        """Every field by name, the settings' flattened as ``settings.<name>``: what
        the run summary records and what two frontends' configs are compared by."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "settings":
                out.update({f"settings.{k}": v
                            for k, v in dataclasses.asdict(value).items()})
            else:
                out[f.name] = value
        out["pace_rate"] = self.pace_rate
        return out
