"""The TFJob rehearsal's model of the operator, without root: TF_CONFIG per replica in
the operator's form (dense, sparse with enableDynamicWorker, a custom cluster domain),
read back by `tictac ps --tf-config`'s reader; Kubernetes' $(VAR) expansion; the
image's folders mapped to local ones. The rehearsal itself: tests/deploy/."""

from __future__ import annotations

import copy
import json
import os

import pytest

from tictac_hooks.cluster.tfjob import (RehearsalError, TFJobRehearsal, cluster_spec,
                                        expand, tf_config)
from tictac_hooks.enforce.tf_config import cluster_from_tf_config

yaml = pytest.importorskip("yaml", reason="PyYAML is a test dependency (setup.cfg [test])")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def manifest() -> dict:
    with open(os.path.join(ROOT, "deploy", "tfjob.yaml")) as f:
        return yaml.safe_load(f)


def test_dense_tf_config_names_every_replica_by_its_service(manifest):
    text = tf_config(manifest, "PS", 1, "team", "cluster.local")
    assert text.startswith('{"cluster":{"chief":["tictac-demo-chief-0.team.svc.cluster.local'
                           ':2222"],"ps":[')
    assert text.endswith(',"task":{"type":"ps","index":1},"environment":"cloud"}')
    spec, job, index = cluster_from_tf_config(text)
    assert (job, index) == ("ps", 1)
    assert spec == cluster_spec(manifest, "team", "cluster.local")
    assert spec["worker"] == ["tictac-demo-worker-0.team.svc.cluster.local:2222",
                              "tictac-demo-worker-1.team.svc.cluster.local:2222"]


def test_sparse_tf_config_as_with_enable_dynamic_worker(manifest):
    manifest["spec"]["enableDynamicWorker"] = True
    ps1 = tf_config(manifest, "PS", 1, "team")
    assert ps1 == ('{"cluster":{"worker":{},"ps":["tictac-demo-ps-1.team.svc:2222"]},'
                   '"task":{"type":"ps","index":1}}')
    assert cluster_from_tf_config(ps1) == ({"ps": {1: "tictac-demo-ps-1.team.svc:2222"}},
                                           "ps", 1)
    worker1 = json.loads(tf_config(manifest, "Worker", 1, "team"))
    assert worker1["cluster"] == {"worker": {"1": "tictac-demo-worker-1.team.svc:2222"},
                                  "ps": ["tictac-demo-ps-0.team.svc:2222",
                                         "tictac-demo-ps-1.team.svc:2222"]}
    # The chief gets neither job: why the manifest leaves enableDynamicWorker off.
    chief = json.loads(tf_config(manifest, "Chief", 0, "team"))
    assert chief["cluster"] == {"worker": {}, "ps": []}


def test_the_port_comes_from_the_tfjob_port(manifest):
    c = manifest["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"]["containers"][0]
    c["ports"] = [{"name": "tfjob-port", "containerPort": 3333}]
    assert cluster_spec(manifest, "team")["ps"][0] == "tictac-demo-ps-0.team.svc:3333"
    c["ports"] = []
    assert cluster_spec(manifest, "team")["ps"][0] == "tictac-demo-ps-0.team.svc:2222"


def test_variables_expand_as_kubernetes_expands_them():
    env = {"POD_IP": "10.0.0.2"}
    assert expand("--bind-host=$(POD_IP)", env) == "--bind-host=10.0.0.2"
    assert expand("$(MISSING) $$(POD_IP) $$", env) == "$(MISSING) $(POD_IP) $"


def test_image_folders_map_to_local_ones_and_missing_ones_are_named(manifest, tmp_path):
    job = TFJobRehearsal(manifest, paths={"/app": str(tmp_path), "/ckpt": "/tmp/x"})
    assert job.local_path("--backup_dir=/ckpt/backup") == "--backup_dir=/tmp/x/backup"
    assert job.local_path("/ckptx") == "/ckptx" and job.local_path("/app") == str(tmp_path)
    assert [p.name for p in job.pods][:2] == ["tictac-demo-chief-0", "tictac-demo-ps-0"]
    assert job.chief.rtype == "Chief"
    no_ckpt = TFJobRehearsal(manifest, paths={"/app": str(tmp_path)})
    with pytest.raises(RehearsalError, match=r"tictac-demo-chief-0: no local folder for "
                                             r"\['/ckpt'\]"):
        no_ckpt._prepare(no_ckpt.chief)


def test_a_replica_type_the_operator_does_not_know_is_refused(manifest):
    broken = copy.deepcopy(manifest)
    broken["spec"]["tfReplicaSpecs"]["Coordinator"] = broken["spec"]["tfReplicaSpecs"].pop(
        "Chief")
    with pytest.raises(RehearsalError, match=r"\['Coordinator'\]"):
        TFJobRehearsal(broken, paths={})
