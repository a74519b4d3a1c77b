"""The cluster tasks' specs as the operators read them: the RL task's RayJob and the multi-node SFT task's PyTorchJob,
built from the serialized task templates as Flyte's backend plugins build them (rehearsal/k8s_resources.py), validate
against the `v1` schema of the CRDs that KubeRay and the Kubeflow training operator install (tests/data/crds/, with
their versions in its README). Fields the schema does not know fail too, as with the API server's strict field
validation (without it, the server would drop them silently). Broken resources are rejected, so the check bites."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from rehearsal.k8s_resources import pytorchjob_resource, rayjob_resource

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "tests" / "data" / "crds"

# Like test_serialization's SCRIPT, plus the container's args and resources, which the plugins build the pods from.
SCRIPT = r"""
import json
from collections import OrderedDict
from flytekit.configuration import Image, ImageConfig, SerializationSettings
from flytekit.tools.translator import get_serializable
from google.protobuf.json_format import MessageToDict
import tasks.sft, tasks.rl

settings = SerializationSettings(image_config=ImageConfig(default_image=Image(name="d", fqn="localhost:30000/x", tag="t")))
out = {}
for name, entity in [("sft", tasks.sft.sft), ("rl", tasks.rl.rl)]:
    t = get_serializable(OrderedDict(), settings, entity).template
    out[name] = {"type": t.type, "version": t.task_type_version, "custom": t.custom, "image": t.container.image,
                 "args": list(t.container.args), "resources": MessageToDict(t.container.resources.to_flyte_idl())}
print("JSON" + json.dumps(out))
"""


def _serialize(env: dict[str, str]) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith("POSTTRAIN_") or k == "POSTTRAIN_REGISTRY"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], check=False, cwd=ROOT, capture_output=True, text=True,
                          timeout=240, env={**base, "PYTHONPATH": str(ROOT), **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("JSON"))[4:])


def _int_range(bits: int):
    return lambda v: not isinstance(v, int) or -(2 ** (bits - 1)) <= v < 2 ** (bits - 1)


FORMATS = jsonschema.FormatChecker([])
FORMATS.checks("int32")(_int_range(32))
FORMATS.checks("int64")(_int_range(64))


def _structural(node):
    """An OpenAPI v3 structural schema node as JSON Schema: `x-kubernetes-int-or-string` accepts an int or a
    string, `nullable` accepts null, and an object with `properties` rejects other fields unless it says
    `x-kubernetes-preserve-unknown-fields`. The other `x-kubernetes-*` keys (list/map types, CEL validations,
    embedded resources) are dropped: the CEL rules are not checked here."""
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: (v if k in ("enum", "default", "example", "required") else _structural(v)) for k, v in node.items()
           if not k.startswith("x-kubernetes-") and k not in ("nullable", "description", "properties")}
    if "properties" in node:  # field names, not schema keywords
        out["properties"] = {k: _structural(v) for k, v in node["properties"].items()}
    if node.get("x-kubernetes-int-or-string") and "type" not in node and "anyOf" not in node:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in node:
        out["type"] = [node["type"], "null"]
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _validator(crd_file: str) -> jsonschema.Draft4Validator:
    crd = yaml.safe_load((CRDS / crd_file).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _structural(version["schema"]["openAPIV3Schema"])
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema, format_checker=FORMATS)


def _errors(validator, resource) -> list[str]:
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(resource))


@pytest.fixture(scope="module")
def rayjob():
    rl = _serialize({})["rl"]
    assert rl["type"] == "ray"
    return rayjob_resource(rl["custom"], rl["image"], args=rl["args"], resources=rl["resources"])


@pytest.fixture(scope="module")
def pytorchjob():
    sft = _serialize({"POSTTRAIN_SFT_NNODES": "2", "POSTTRAIN_SFT_NPROC": "2"})["sft"]
    assert (sft["type"], sft["version"]) == ("pytorch", 1)
    return pytorchjob_resource(sft["custom"], sft["image"], args=sft["args"], resources=sft["resources"])


@pytest.fixture(scope="module")
def rayjob_schema():
    return _validator("ray.io_rayjobs.yaml")


@pytest.fixture(scope="module")
def pytorchjob_schema():
    return _validator("kubeflow.org_pytorchjobs.yaml")


@pytest.mark.timeout(300)
def test_rl_rayjob_is_valid_for_kuberay(rayjob, rayjob_schema):
    assert _errors(rayjob_schema, rayjob) == []
    cluster = rayjob["spec"]["rayClusterSpec"]
    assert {g["groupName"]: g["replicas"] for g in cluster["workerGroupSpecs"]} == {"rollout": 1, "train": 2}
    head = cluster["headGroupSpec"]["template"]["spec"]
    (c,) = head["containers"]
    assert c["name"] == "ray-head" and c["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}
    assert c["volumeMounts"] == [{"mountPath": "/dev/shm", "name": "dshm"}]
    for g in cluster["workerGroupSpecs"]:
        (c,) = g["template"]["spec"]["containers"]
        assert c["name"] == "ray-worker" and c["image"] == rayjob["spec"]["submitterPodTemplate"]["spec"][
            "containers"][0]["image"]
        assert json.loads(g["rayStartParams"]["resources"].strip("'")) == {g["groupName"]: 1000}
    assert rayjob["spec"]["entrypoint"].startswith("pyflyte-execute ")
    assert rayjob["spec"]["ttlSecondsAfterFinished"] == 600


@pytest.mark.timeout(300)
def test_multi_node_sft_pytorchjob_is_valid_for_the_training_operator(pytorchjob, pytorchjob_schema):
    assert _errors(pytorchjob_schema, pytorchjob) == []
    spec = pytorchjob["spec"]
    assert set(spec["pytorchReplicaSpecs"]) == {"Worker"}  # elastic: no Master
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 2 and worker["restartPolicy"] == "Never"
    # the training operator's webhook also wants a container named "pytorch" with an image
    (c,) = worker["template"]["spec"]["containers"]
    assert c["name"] == "pytorch" and c["image"].startswith("localhost:30000/posttrain-cpu:")
    assert c["resources"] == {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}}
    assert spec["elasticPolicy"] == {"minReplicas": 2, "maxReplicas": 2, "rdzvBackend": "c10d", "nProcPerNode": 2,
                                     "maxRestarts": 2}


def _broken(resource, path, value):
    bad = copy.deepcopy(resource)
    node = bad
    for key in path[:-1]:
        node = node[key]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return bad


GROUP = ["spec", "rayClusterSpec", "workerGroupSpecs", 0]
WORKER = ["spec", "pytorchReplicaSpecs", "Worker"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path,value,expect", [
    (GROUP + ["rayStartParams", "num-cpus"], 2, "2 is not of type 'string'"),
    (GROUP + ["replicas"], "2", "'2' is not of type 'integer'"),
    (GROUP + ["groupName"], KeyError, "'groupName' is a required property"),
    (GROUP + ["replicas"], 2**31, "is not a 'int32'"),
    (GROUP + ["template", "spec", "containers", 0, "resources", "requests", "memory"], "4 GiB", "does not match"),
    (GROUP + ["template", "spec", "containers", 0, "ports", 0, "containerPort"], "6379", "is not of type 'integer'"),
    (["spec", "rayClusterSpec", "headGroupSpec", "template"], KeyError, "'template' is a required property"),
    (["spec", "rayClusterSpec", "workerGroupSpec"], [], "Additional properties are not allowed"),
])
def test_a_broken_rayjob_is_rejected(rayjob, rayjob_schema, path, value, expect):
    errors = _errors(rayjob_schema, _broken(rayjob, path, value))
    assert any(expect in e for e in errors), errors


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path,value,expect", [
    (WORKER + ["replicas"], "2", "'2' is not of type 'integer'"),
    (["spec", "elasticPolicy", "nProcPerNode"], "2", "'2' is not of type 'integer'"),
    (["spec", "pytorchReplicaSpecs"], KeyError, "'pytorchReplicaSpecs' is a required property"),
    (WORKER + ["template", "spec", "containers", 0, "name"], KeyError, "'name' is a required property"),
    (["spec", "elasticPolicy", "nprocPerNode"], 2, "Additional properties are not allowed"),
])
def test_a_broken_pytorchjob_is_rejected(pytorchjob, pytorchjob_schema, path, value, expect):
    errors = _errors(pytorchjob_schema, _broken(pytorchjob, path, value))
    assert any(expect in e for e in errors), errors
