"""Cluster-spec parsing (run/cluster_spec.py): the PS and worker addresses of a
dict, a sparse job or a tf.train.ClusterSpec-like object; the error without a PS job;
and whether a task at an address answers."""

import types

import grpc
import pytest

from tictac_hooks.run.cluster_spec import (_job_tasks, ps_addresses_from_cluster_spec,
                                                 task_addresses_from_cluster_spec,
                                                 task_answers)
from tictac_hooks.run.settings import TicTacSetupError
from tictac_hooks.ports import free_port

SPEC = {"ps": ["h0:2222", "h1:2222"], "worker": ["w0:2222", "w1:2222", "w2:2222"]}


def test_addresses_in_task_order_from_a_dict():
    assert ps_addresses_from_cluster_spec(SPEC) == ["h0:2222", "h1:2222"]
    assert task_addresses_from_cluster_spec(SPEC) == {
        "worker:0": "w0:2222", "worker:1": "w1:2222", "worker:2": "w2:2222"}
    assert task_addresses_from_cluster_spec(SPEC, "ps") == {"ps:0": "h0:2222",
                                                             "ps:1": "h1:2222"}


def test_a_sparse_job_is_ordered_by_task_index_and_keeps_the_indices():
    sparse = {"ps": {1: "h1:2222", 0: "h0:2222"}, "worker": {"3": "w3:2222"}}
    assert _job_tasks(sparse, "ps") == [(0, "h0:2222"), (1, "h1:2222")]
    assert ps_addresses_from_cluster_spec(sparse) == ["h0:2222", "h1:2222"]
    assert task_addresses_from_cluster_spec(sparse) == {"worker:3": "w3:2222"}


def test_a_cluster_spec_object_is_read_through_as_dict():
    spec = types.SimpleNamespace(as_dict=lambda: SPEC)
    assert ps_addresses_from_cluster_spec(spec) == ["h0:2222", "h1:2222"]
    assert _job_tasks(spec, "chief") == []


@pytest.mark.parametrize("spec", [{"worker": ["w0:2222"]}, {"ps": []}, {}, None])
def test_no_ps_job_is_a_setup_error_that_says_what_tictac_needs(spec):
    with pytest.raises(TicTacSetupError, match="the cluster has no 'ps' job.*"
                                               "ParameterServerStrategy"):
        ps_addresses_from_cluster_spec(spec)
    assert task_addresses_from_cluster_spec(spec or {}, "ps") == {}


def test_a_task_where_nothing_listens_does_not_answer():
    assert task_answers(f"127.0.0.1:{free_port()}", timeout_s=2.0) is False


def test_a_task_that_answers_anything_is_alive():
    """A gRPC server at the address answers (here UNIMPLEMENTED: not a TensorFlow
    worker, but something listens): the task is not lost."""
    from concurrent import futures
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert task_answers(f"127.0.0.1:{port}", timeout_s=5.0) is True
    finally:
        server.stop(0)
