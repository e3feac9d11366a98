"""TF_CONFIG as Kubeflow's TFJob operator writes it (dense, sparse, a custom cluster
domain), the PS's bind host on Kubernetes, and the exit codes the operator reads: a
configuration error is permanent (2), a name that does not resolve in time is retried
(203). No TensorFlow here: all of it happens before `tictac ps` imports TensorFlow."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys

import pytest

from tictac_hooks.cluster.launcher import repo_pythonpath
from tictac_hooks.enforce.tf_config import (EXIT_CONFIG, EXIT_RETRY, NotResolvedError,
                                            cluster_from_tf_config, is_address_literal,
                                            unexpanded_variable, wait_resolvable)

TICTAC = [sys.executable, "-m", "tictac_hooks.cli"]


def names(job: str, n: int, domain: str = "") -> list[str]:
    return [f"demo-{job}-{i}.team.svc{'.' + domain if domain else ''}:2222" for i in range(n)]


def test_dense_tf_config_as_the_operator_writes_it():
    # Go's encoding/json: keys of the cluster map sorted, "environment": "cloud".
    text = json.dumps({"cluster": {"chief": names("chief", 1), "ps": names("ps", 2),
                                   "worker": names("worker", 3)},
                       "task": {"type": "ps", "index": 1}, "environment": "cloud"},
                      separators=(",", ":"))
    spec, job, index = cluster_from_tf_config(text)
    assert (job, index) == ("ps", 1)
    assert spec == {"chief": names("chief", 1), "ps": names("ps", 2),
                    "worker": names("worker", 3)}


def test_sparse_tf_config_of_a_ps_and_of_a_worker():
    # enableDynamicWorker: a PS's "ps" holds only itself while its index stays N; the
    # worker job is an empty object. A worker's "worker" maps its index to itself.
    ps1 = names("ps", 2, "cluster.local")[1]
    spec, job, index = cluster_from_tf_config(
        {"cluster": {"worker": {}, "ps": [ps1]}, "task": {"type": "ps", "index": 1}})
    assert (spec, job, index) == ({"ps": {1: ps1}}, "ps", 1)
    w2 = names("worker", 3)[2]
    spec, job, index = cluster_from_tf_config(json.dumps(
        {"cluster": {"worker": {"2": w2}, "ps": names("ps", 2)},
         "task": {"type": "worker", "index": 2}}))
    assert (spec, job, index) == ({"worker": {2: w2}, "ps": names("ps", 2)}, "worker", 2)
    # ps:0 of the sparse form is a list of one, as in the dense form.
    spec, _, _ = cluster_from_tf_config(
        {"cluster": {"worker": {}, "ps": [names("ps", 1)[0]]}, "task": {"type": "ps",
                                                                       "index": 0}})
    assert spec == {"ps": names("ps", 1)}


def test_a_dense_index_past_its_job_is_not_taken_for_the_sparse_form():
    spec, _, index = cluster_from_tf_config(
        {"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 3}})
    assert spec == {"ps": ["127.0.0.1:1"]} and index == 3  # `tictac ps` rejects it


@pytest.mark.parametrize("tf_config, message", [
    ('{"cluster": {"worker": {"one": "a:1"}, "ps": []}, "task": {"type": "worker", '
     '"index": 1}}', "TF_CONFIG's job 'worker' maps task indices"),
    ('{"cluster": {}, "task": {"type": "ps", "index": "x"}}', "TF_CONFIG must look like"),
])
def test_a_malformed_tf_config_says_what_is_wrong(tf_config, message):
    with pytest.raises(ValueError, match=message):
        cluster_from_tf_config(tf_config)


def test_an_unexpanded_kubernetes_variable_is_named():
    unexpanded_variable("10.1.2.3", "--bind-host")
    with pytest.raises(ValueError, match=r"\$\(POD_IP\).*status\.podIP"):
        unexpanded_variable("$(POD_IP)", "--bind-host")


def test_addresses_need_no_resolving():
    assert all(map(is_address_literal, ["10.1.2.3", "fd00::1", "[fd00::1]", "0.0.0.0"]))
    assert not any(map(is_address_literal, ["demo-ps-0.team.svc", "localhost", ""]))


def _resolver_after(failures: int):
    calls = []

    def resolve(name):
        calls.append(name)
        if len(calls) <= failures:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", 0))]
    return resolve, calls


def test_a_name_that_resolves_late_is_waited_for_with_a_line():
    resolve, calls = _resolver_after(2)
    out = io.StringIO()
    waited = wait_resolvable("demo-ps-0.team.svc", 30, "ps:0", out=out, resolve=resolve)
    assert len(calls) == 3 and 0.5 <= waited < 10, (calls, waited)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("tictac ps: waiting for ps:0's host demo-ps-0.team.svc to "
                               "resolve (Name or service not known; 0 of 30 s)"), lines
    assert lines[-1].startswith("tictac ps: demo-ps-0.team.svc resolves now, after"), lines
    assert len(lines) == 2, lines  # one line per 10 s of waiting, not one per try


def test_a_name_that_never_resolves_is_a_transient_error():
    resolve, _ = _resolver_after(10**6)
    with pytest.raises(NotResolvedError, match=rf"did not resolve within 1 s .*exiting "
                                               rf"with {EXIT_RETRY} .*--bind-host \$\(POD_IP\)"):
        wait_resolvable("demo-ps-0.team.svc", 1.0, "ps:0", out=io.StringIO(),
                        resolve=resolve)
    # An address is never looked up.
    assert wait_resolvable("10.0.0.7", 0, "ps:0", resolve=resolve) == 0.0


def test_the_operator_reads_the_exit_codes_as_meant():
    # training-operator v1.9 (pkg/util/train): ExitCode policy retries 128-255 only.
    assert 1 <= EXIT_CONFIG <= 127 and 128 <= EXIT_RETRY <= 255


def _tictac_ps(tf_config: dict, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(PYTHONPATH=repo_pythonpath(), TF_CONFIG=json.dumps(tf_config))
    return subprocess.run([*TICTAC, "ps", "--tf-config", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_tictac_ps_exits_for_a_retry_when_its_name_does_not_resolve():
    # RFC 6761: names under .invalid never resolve.
    sparse = {"cluster": {"worker": {}, "ps": ["demo-ps-1.team.svc.invalid:2222"]},
              "task": {"type": "ps", "index": 1}}
    out = _tictac_ps(sparse, "--resolve-timeout", "1")
    assert out.returncode == EXIT_RETRY, (out.returncode, out.stderr)
    assert "tictac ps: waiting for ps:1's host demo-ps-1.team.svc.invalid" in out.stderr
    assert f"did not resolve within 1 s" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("bind, message", [
    ("$(POD_IP)", "holds the Kubernetes reference $(POD_IP)"),
    ("", "--bind-host is empty"),
])
def test_tictac_ps_with_an_unusable_bind_host_is_a_configuration_error(bind, message):
    dense = {"cluster": {"ps": ["demo-ps-0.team.svc.invalid:2222"]},
             "task": {"type": "ps", "index": 0}}
    out = _tictac_ps(dense, f"--bind-host={bind}")
    assert out.returncode == EXIT_CONFIG, (out.returncode, out.stderr)
    assert f"tictac ps: error: " in out.stderr and message in out.stderr, out.stderr
