"""The cluster as a cluster spec describes it: the PS and worker addresses, and whether a
task at an address still answers."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from tictac_hooks.run.settings import TicTacSetupError


def _job_tasks(spec: Mapping[str, Sequence[str]] | Any, job: str) -> list[tuple[int, str]]:
    """(task index, address) of a cluster spec's ``job``, in task order (dict or
    tf.train.ClusterSpec; a sparse job {index: address} too); [] without the job."""
    if hasattr(spec, "as_dict"):
        spec = spec.as_dict()
    tasks = spec.get(job) if isinstance(spec, Mapping) else None
    if isinstance(tasks, Mapping):  # sparse cluster spec {task index: address}
        return sorted((int(i), a) for i, a in tasks.items())
    return list(enumerate(tasks or ()))


def worker_addresses_of(strategy: Any) -> dict[str, str]:
    """Each worker task's address of a ParameterServerStrategy ({} for any other
    strategy, or none): whom the coordinator spreads its steps over, and whom to ask
    whether a silent worker still answers."""
    import tensorflow as tf
    if not isinstance(strategy, (tf.distribute.ParameterServerStrategy,
                                 tf.distribute.experimental.ParameterServerStrategy)):
        return {}
    from tictac_hooks.patches import keras_internals
    return task_addresses_from_cluster_spec(
        keras_internals.strategy_cluster_spec(strategy), "worker")


def ps_addresses_from_cluster_spec(spec: Mapping[str, Sequence[str]] | Any) -> list[str]:
    """The PS addresses, in task order, of a cluster spec (dict or tf.train.ClusterSpec)."""
    ps = _job_tasks(spec, "ps")
    if not ps:
        raise TicTacSetupError(
            "the cluster has no 'ps' job: TicTac orders parameter transfers from "
            "parameter servers, so it needs ParameterServerStrategy or a PS cluster")
    return [address for _, address in ps]


def task_addresses_from_cluster_spec(spec: Mapping[str, Sequence[str]] | Any,
                                     job: str = "worker") -> dict[str, str]:
    """``{"worker:0": address, ...}`` of a cluster spec's ``job``."""
    return {f"{job}:{i}": address for i, address in _job_tasks(spec, job)}


def task_answers(address: str, timeout_s: float = 2.0) -> bool | None:
    """Whether the TensorFlow task at ``address`` answers (its worker service's
    GetStatus): False when nothing listens there, None when it did not answer in time
    (a busy task), True when it answered."""
    import grpc

    from tictac_hooks.enforce.native.client import GET_STATUS
    with grpc.insecure_channel(address) as channel:
        try:
            channel.unary_unary(GET_STATUS)(b"", timeout=timeout_s)
            return True
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                return False
            return None if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else True
