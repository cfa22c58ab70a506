"""The CRDs hold upstream v1.5.0's fields: InferencePoolImport, the pool status'
``parents[].controllerName`` (else the API server prunes what gateways write) and the
bundle-version annotation (applying ours over v1.5 CRDs must not say it is older)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.charts.render import CRDS
from tests.charts.test_charts import K8S_VERSION, crd_schema

GIE_MIRROR = Path("/work/.mirror/kubernetes-sigs+gateway-api-inference-extension/repo")
#: The CRDs of upstream's v1.5.0 bundle (config/crd/bases), all of which we ship.
V1_5_BUNDLE = (
    "inference.networking.k8s.io_inferencepools.yaml",
    "inference.networking.x-k8s.io_inferenceobjectives.yaml",
    "inference.networking.x-k8s.io_inferencemodelrewrites.yaml",
    "inference.networking.x-k8s.io_inferencepoolimports.yaml",
)
X = "inference.networking.x-k8s.io"


def field_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, sub in (schema.get("properties") or {}).items():
        out.add(f"{prefix}.{name}")
        out |= field_paths(sub, f"{prefix}.{name}")
    if "items" in schema:
        out |= field_paths(schema["items"], f"{prefix}[]")
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in CRDS.glob("*.yaml")))
def test_crd_validates_strictly(name: str) -> None:
    kubernetes_validate.validate(yaml.safe_load((CRDS / name).read_text()), K8S_VERSION,
                                 strict=True)


@pytest.mark.parametrize("name", V1_5_BUNDLE)
def test_bundle_version_is_v1_5_0(name: str) -> None:
    crd = yaml.safe_load((CRDS / name).read_text())
    assert crd["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"] == (
        "v1.5.0")


@pytest.mark.parametrize("name", V1_5_BUNDLE)
def test_fields_are_upstreams(name: str) -> None:
    if not GIE_MIRROR.exists():
        pytest.skip("the upstream GIE mirror is not on this machine (the CRDs were compared "
                    "with it at v1.5.0; the tests below pin the added fields)")
    text = subprocess.run(["git", "-C", str(GIE_MIRROR), "show",
                           f"v1.5.0:config/crd/bases/{name}"],
                          capture_output=True, text=True, check=True).stdout
    theirs = yaml.safe_load(text)
    ours = yaml.safe_load((CRDS / name).read_text())
    for version in theirs["spec"]["versions"]:
        (mine,) = [v for v in ours["spec"]["versions"] if v["name"] == version["name"]]
        assert field_paths(mine["schema"]["openAPIV3Schema"]) == field_paths(
            version["schema"]["openAPIV3Schema"]), version["name"]


def pool_with_parent(controller: str) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "targetPorts": [{"number": 8000}],
                 "endpointPickerRef": {"name": "p-epp", "port": {"number": 9002}}},
        "status": {"parents": [{
            "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                          "name": "gw"},
            "controllerName": controller,
            "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        }]},
    }


def test_pool_status_keeps_the_parents_controller_name() -> None:
    schema = crd_schema("inference.networking.k8s.io", "inferencepools", "v1")
    assert ".status.parents[].controllerName" in field_paths(schema)
    jsonschema.validate(pool_with_parent("example.net/gateway-controller"), schema)
    with pytest.raises(jsonschema.ValidationError, match="does not match"):
        jsonschema.validate(pool_with_parent("example.net"), schema)  # no path


def import_object(**status: Any) -> dict[str, Any]:
    return {"apiVersion": f"{X}/v1alpha1", "kind": "InferencePoolImport",
            "metadata": {"name": "pool-a", "namespace": "llm"}, "status": status}


def test_inference_pool_import_holds_controllers_clusters_and_parents() -> None:
    schema = crd_schema(X, "inferencepoolimports", "v1alpha1")
    assert {".status.controllers[].name", ".status.controllers[].exportingClusters[].name",
            ".status.controllers[].parents[].parentRef.name",
            ".status.controllers[].parents[].controllerName",
            ".status.controllers[].conditions[].type"} <= field_paths(schema)
    parent = pool_with_parent("example.net/gateway-controller")["status"]["parents"][0]
    jsonschema.validate(import_object(controllers=[{
        "name": "example.net/import-controller",
        "exportingClusters": [{"name": "cluster-1"}, {"name": "cluster-2"}],
        "parents": [parent],
        "conditions": parent["conditions"],
    }]), schema)
    jsonschema.validate(import_object(controllers=[]), schema)


@pytest.mark.parametrize(("status", "message"), [
    ({}, "'controllers' is a required property"),
    ({"controllers": [{"name": "no-path"}]}, "does not match"),
    ({"controllers": [{"name": "a.io/c", "exportingClusters": [{}]}]}, "'name' is a required"),
    ({"controllers": [{"name": f"a.io/c{i}"} for i in range(9)]}, "is too long"),
])
def test_inference_pool_import_rejects_bad_status(status: dict[str, Any], message: str) -> None:
    with pytest.raises(jsonschema.ValidationError, match=message):
        jsonschema.validate(import_object(**status),
                            crd_schema(X, "inferencepoolimports", "v1alpha1"))


def test_inference_pool_import_is_namespaced_with_upstreams_names() -> None:
    crd = yaml.safe_load((CRDS / f"{X}_inferencepoolimports.yaml").read_text())
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["shortNames"] == ["infpimp"]
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
