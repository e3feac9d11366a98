"""deploy/tfjob.yaml against the TFJob CRD of training-operator v1.9.4 (the fixture beside
this file), and against what the CRD's schema does not say: what the operator's
validating webhook rejects, what Kubernetes would silently drop, and what
TensorFlow's ParameterServerStrategy and TicTac need. Each rule is shown failing on a
manifest that breaks it."""

from __future__ import annotations

import copy
import functools
import os
import re
from typing import Any, Iterator

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is a test dependency (setup.cfg [test])")
jsonschema = pytest.importorskip("jsonschema",
                                 reason="jsonschema is a test dependency (setup.cfg [test])")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANIFEST = os.path.join(ROOT, "deploy", "tfjob.yaml")
DOCKERFILE = os.path.join(ROOT, "deploy", "Dockerfile")
CRD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kubeflow.org_tfjobs.yaml")

# The operator's own values (pkg/apis/kubeflow.org/v1, v1.9.4); the CRD lists none.
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
CLEAN_POD_POLICIES = {"All", "Running", "None"}
PSS_REPLICA_TYPES = {"Chief", "PS", "Worker"}   # TF2 rejects Master; no Evaluator
CONTAINER = "tensorflow"                        # the only container given TF_CONFIG
PORT_NAME = "tfjob-port"                        # the port the operator puts in TF_CONFIG
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def load_manifest() -> dict:
    with open(MANIFEST) as f:
        return yaml.safe_load(f)


@functools.lru_cache(maxsize=1)
def crd_schema() -> dict:
    """The CRD's v1 schema (read once; not to be changed)."""
    with open(CRD) as f:
        crd = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert crd["spec"]["names"]["kind"] == "TFJob", crd["spec"]["names"]
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def schema_errors(manifest: dict) -> list[str]:
    validator = jsonschema.Draft4Validator(crd_schema())
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(manifest)]


def pruned_fields(value: Any, schema: dict, path: str = "") -> Iterator[str]:
    """Fields a structural schema does not declare: the API server drops them without a
    word (a misplaced key that then does nothing)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                yield from pruned_fields(item, props[key], f"{path}/{key}")
            elif isinstance(extra, dict):
                yield from pruned_fields(item, extra, f"{path}/{key}")
            elif props is not None or extra is False:
                yield f"{path}/{key}"
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from pruned_fields(item, schema["items"], f"{path}/{i}")


def container(replica: dict) -> dict:
    return next(c for c in replica["template"]["spec"]["containers"]
                if c.get("name") == CONTAINER)


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def rule_violations(manifest: dict) -> list[str]:
    """What the operator's webhook (v1.9.4, pkg/webhooks/tensorflow) rejects and what a
    ParameterServerStrategy job with TicTac's PS needs; each entry says what is wrong."""
    out = []
    if not DNS_1035.match(manifest["metadata"].get("name", "")) or \
            len(manifest["metadata"]["name"]) > 63:
        out.append("metadata.name must be a DNS-1035 label (the webhook)")
    spec = manifest["spec"]
    if spec.get("enableDynamicWorker"):
        out.append("enableDynamicWorker gives the chief a TF_CONFIG without the cluster")
    run = spec.get("runPolicy", {})
    if run.get("cleanPodPolicy") not in CLEAN_POD_POLICIES - {"None"}:
        out.append(f"runPolicy.cleanPodPolicy {run.get('cleanPodPolicy')!r}: PS and "
                   "workers never exit; use Running or All")
    replicas = spec.get("tfReplicaSpecs") or {}
    if set(replicas) - PSS_REPLICA_TYPES:
        out.append(f"replica types {sorted(set(replicas) - PSS_REPLICA_TYPES)} are not "
                   f"among {sorted(PSS_REPLICA_TYPES)}")
    if not {"PS", "Worker"} <= set(replicas) or len(set(replicas) & {"Chief", "Master"}) > 1:
        out.append("a PSS job needs PS and Worker replicas and at most one Chief")
    for rtype, replica in replicas.items():
        where = f"tfReplicaSpecs.{rtype}"
        policy = replica.get("restartPolicy")
        if policy not in RESTART_POLICIES:
            out.append(f"{where}.restartPolicy {policy!r} not in {sorted(RESTART_POLICIES)}")
        containers = replica.get("template", {}).get("spec", {}).get("containers") or []
        if any(not c.get("image") for c in containers):
            out.append(f"{where}: every container needs an image (the webhook)")
        if not any(c.get("name") == CONTAINER for c in containers):
            out.append(f"{where}: no container named {CONTAINER!r} (the webhook)")
            continue
        c = container(replica)
        env = env_of(c)
        ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
        if not isinstance(ports.get(PORT_NAME), int):
            out.append(f"{where}: no containerPort named {PORT_NAME!r}")
        if env.get("GRPC_FAIL_FAST", {}).get("value") != "use_caller":
            out.append(f"{where}: GRPC_FAIL_FAST=use_caller is missing")
        annotations = replica["template"].get("metadata", {}).get("annotations", {})
        if annotations.get("sidecar.istio.io/inject") != "false":
            out.append(f"{where}: Istio's sidecar injection is not turned off")
        probe = c.get("readinessProbe")
        if probe and probe.get("tcpSocket", {}).get("port") not in (PORT_NAME,
                                                                    ports.get(PORT_NAME)):
            out.append(f"{where}: the readiness probe must check the task's own port")
    ps = replicas.get("PS")
    if ps:
        c = container(ps) if any(x.get("name") == CONTAINER for x in
                                 ps["template"]["spec"]["containers"]) else {}
        argv = c.get("command", []) + c.get("args", [])
        if argv[:3] != ["tictac", "ps", "--tf-config"]:
            out.append(f"tfReplicaSpecs.PS runs {argv}, not `tictac ps --tf-config`")
        bind = [a for a in argv if a.startswith("--bind-host")]
        pod_ip = env_of(c).get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {})
        if bind != ["--bind-host=$(POD_IP)"] or pod_ip.get("fieldPath") != "status.podIP":
            out.append("the PS must bind its pod IP (--bind-host=$(POD_IP), POD_IP from "
                       "status.podIP): its own name resolves only once it is Ready")
        if ps.get("restartPolicy") != "ExitCode":
            out.append("tfReplicaSpecs.PS.restartPolicy must be ExitCode (a configuration "
                       "error fails the job; a transient one restarts the PS)")
        if "readinessProbe" not in c:
            out.append("tfReplicaSpecs.PS has no readiness probe")
    return out


def test_the_manifest_is_valid_against_the_tfjob_crd():
    manifest = load_manifest()
    assert manifest["apiVersion"] == "kubeflow.org/v1" and manifest["kind"] == "TFJob"
    assert schema_errors(manifest) == []
    assert list(pruned_fields(manifest, crd_schema())) == []


@pytest.mark.parametrize("path, value, message", [
    (("spec", "tfReplicaSpecs", "PS", "replicas"), "two", "is not of type 'integer'"),
    (("spec", "runPolicy", "backoffLimit"), [6], "is not of type 'integer'"),
    (("spec", "tfReplicaSpecs", "Worker", "template", "spec", "containers"), "tensorflow",
     "is not of type 'array'"),
])
def test_the_schema_check_rejects_a_wrong_type(path, value, message):
    manifest = load_manifest()
    node = manifest
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    errors = schema_errors(manifest)
    assert any(message in e for e in errors), errors


def test_a_misplaced_field_is_reported_as_dropped():
    manifest = load_manifest()
    manifest["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"]["restartPolicy2"] = "x"
    manifest["spec"]["cleanPodPolicy"] = "Running"  # belongs in runPolicy
    assert schema_errors(manifest) == []   # the schema allows it ...
    assert sorted(pruned_fields(manifest, crd_schema())) == [   # ... and drops it
        "/spec/cleanPodPolicy", "/spec/tfReplicaSpecs/PS/template/spec/restartPolicy2"]


def test_the_manifest_meets_the_webhook_and_parameter_server_rules():
    assert rule_violations(load_manifest()) == []


def _break(change):
    manifest = load_manifest()
    change(manifest)
    return rule_violations(manifest)


def _replicas(m):
    return m["spec"]["tfReplicaSpecs"]


@pytest.mark.parametrize("change, message", [
    (lambda m: _replicas(m).__setitem__("Master", _replicas(m).pop("Chief")),
     "replica types ['Master']"),
    (lambda m: _replicas(m).__setitem__("Evaluator", copy.deepcopy(_replicas(m)["Worker"])),
     "replica types ['Evaluator']"),
    (lambda m: container(_replicas(m)["Worker"]).__setitem__("name", "main"),
     "tfReplicaSpecs.Worker: no container named 'tensorflow'"),
    (lambda m: _replicas(m)["Worker"].__setitem__("restartPolicy", "Sometimes"),
     "tfReplicaSpecs.Worker.restartPolicy 'Sometimes'"),
    (lambda m: _replicas(m)["PS"].__setitem__("restartPolicy", "OnFailure"),
     "PS.restartPolicy must be ExitCode"),
    (lambda m: container(_replicas(m)["PS"])["ports"][0].__setitem__("name", "grpc"),
     "tfReplicaSpecs.PS: no containerPort named 'tfjob-port'"),
    (lambda m: container(_replicas(m)["Chief"]).__setitem__("env", []),
     "tfReplicaSpecs.Chief: GRPC_FAIL_FAST=use_caller is missing"),
    (lambda m: container(_replicas(m)["PS"]).__setitem__(
        "command", ["tictac", "ps", "--tf-config"]), "the PS must bind its pod IP"),
    (lambda m: m["spec"]["runPolicy"].pop("cleanPodPolicy"), "cleanPodPolicy None"),
    (lambda m: m["spec"].__setitem__("enableDynamicWorker", True), "enableDynamicWorker"),
    (lambda m: _replicas(m)["PS"]["template"]["metadata"].pop("annotations"),
     "tfReplicaSpecs.PS: Istio's sidecar injection is not turned off"),
    (lambda m: container(_replicas(m)["Worker"])["readinessProbe"]["tcpSocket"]
     .__setitem__("port", 8080), "the readiness probe must check the task's own port"),
    (lambda m: m["metadata"].__setitem__("name", "TicTac_demo"), "DNS-1035"),
], ids=["master", "evaluator", "container-name", "restart-policy", "ps-restart", "port",
        "fail-fast", "ps-bind", "clean-pod-policy", "dynamic-worker", "istio", "probe",
        "name"])
def test_each_rule_fails_on_a_manifest_that_breaks_it(change, message):
    violations = _break(change)
    assert any(message in v for v in violations), violations


def test_the_image_runs_what_the_manifest_asks():
    """The Dockerfile puts the chief's script where the manifest runs it, builds the
    native gate at image build, and installs the TensorFlow scripts/setup_env.sh tests."""
    with open(DOCKERFILE) as f:
        dockerfile = f.read()
    chief = container(_replicas(load_manifest())["Chief"])
    script = chief["command"][1]
    assert f"WORKDIR {chief['workingDir']}" in dockerfile
    assert re.search(rf"^COPY deploy/{re.escape(script)} \./$", dockerfile, re.M), script
    assert re.search(r"^RUN tictac build$", dockerfile, re.M)
    with open(os.path.join(ROOT, "scripts", "setup_env.sh")) as f:
        tested = re.search(r'"tensorflow-cpu==([^"]+)"', f.read()).group(1)
    assert f"ARG TF_VERSION={tested}" in dockerfile, tested
    assert os.path.isfile(os.path.join(ROOT, "deploy", script))


GPU_WORKERS = os.path.join(ROOT, "deploy", "gpu-workers.yaml")


def gpu_manifest() -> dict:
    """deploy/tfjob.yaml with its Worker section replaced by deploy/gpu-workers.yaml, as
    the latter's header tells users to."""
    manifest = load_manifest()
    with open(GPU_WORKERS) as f:
        _replicas(manifest)["Worker"] = yaml.safe_load(f)
    return manifest


def test_the_gpu_variant_is_valid_and_asks_for_gpus_on_gpu_nodes():
    manifest = gpu_manifest()
    assert schema_errors(manifest) == []
    assert list(pruned_fields(manifest, crd_schema())) == []
    assert rule_violations(manifest) == []
    worker = _replicas(manifest)["Worker"]
    spec, c = worker["template"]["spec"], container(worker)
    assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    assert spec["nodeSelector"] and any(t["key"] == "nvidia.com/gpu"
                                        for t in spec["tolerations"])
    cpu_images = {container(r)["image"] for n, r in _replicas(manifest).items()
                  if n != "Worker"}
    assert c["image"] not in cpu_images and c["image"].endswith("-gpu")


def _dockerfile_args() -> dict[str, str]:
    with open(DOCKERFILE) as f:
        return dict(re.findall(r"^ARG (\w+)=(\S+)$", f.read(), re.M))


def test_the_image_recipe_takes_the_tensorflow_package_and_base_as_build_args():
    with open(DOCKERFILE) as f:
        dockerfile = f.read()
    args = _dockerfile_args()
    assert args["TF_PACKAGE"] == "tensorflow-cpu" and "BASE_IMAGE" in args
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", dockerfile, re.M)
    assert '"${TF_PACKAGE}==${TF_VERSION}"' in dockerfile
    with open(GPU_WORKERS) as f:
        assert "--build-arg TF_PACKAGE='tensorflow[and-cuda]'" in f.read()


@pytest.mark.slow
@pytest.mark.parametrize("package", ["tensorflow-cpu", "tensorflow[and-cuda]"])
def test_the_recipes_packages_resolve(package, tmp_path):
    """What the image's pip install step asks for resolves on the package index, for
    the CPU image and the GPU one (CUDA libraries included), without installing."""
    import json
    import subprocess
    import sys
    version = _dockerfile_args()["TF_VERSION"]
    report = tmp_path / "report.json"
    run = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
         f"{package}=={version}", f"tf_keras=={version}", "--report", str(report)],
        capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        if "No matching distribution" in run.stderr or "ResolutionImpossible" in run.stderr:
            pytest.fail(f"the image's packages do not resolve: {run.stderr[-2000:]}")
        pytest.skip(f"no package index reachable to resolve against: {run.stderr[-500:]}")
    installed = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
                 for i in json.loads(report.read_text())["install"]}
    name = package.split("[")[0]
    assert installed[name].startswith(version.rstrip("*")), installed
    if "and-cuda" in package:
        assert any(n.startswith("nvidia-cudnn") for n in installed), sorted(installed)
