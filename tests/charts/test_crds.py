"""The CRDs hold upstream's fields: GIE v1.6.0's InferencePool (``endpointPickerRef``
optional) and InferencePoolImport, GIE v1.5.0's InferenceObjective and InferenceModelRewrite
in their deprecated group (v1.6 no longer ships them), llm-d-router v0.10.0's in ``llm-d.ai``;
the pool status' ``parents[].controllerName`` (else the API server prunes what gateways
write) and the bundle-version annotations (applying ours over upstream's must not say it is
older)."""

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
ROUTER_MIRROR = Path("/work/.mirror/llm-d+llm-d-router/repo")
#: Our CRD file → (upstream mirror, tag, path there, bundle-version annotation key and value).
UPSTREAM = {
    "inference.networking.k8s.io_inferencepools.yaml":
        (GIE_MIRROR, "v1.6.0", "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml",
         "inference.networking.k8s.io/bundle-version", "v1.6.0"),
    "inference.networking.x-k8s.io_inferencepoolimports.yaml":
        (GIE_MIRROR, "v1.6.0",
         "config/crd/bases/inference.networking.x-k8s.io_inferencepoolimports.yaml",
         "inference.networking.k8s.io/bundle-version", "v1.6.0"),
    "inference.networking.x-k8s.io_inferenceobjectives.yaml":
        (GIE_MIRROR, "v1.5.0",
         "config/crd/bases/inference.networking.x-k8s.io_inferenceobjectives.yaml",
         "inference.networking.k8s.io/bundle-version", "v1.5.0"),
    "inference.networking.x-k8s.io_inferencemodelrewrites.yaml":
        (GIE_MIRROR, "v1.5.0",
         "config/crd/bases/inference.networking.x-k8s.io_inferencemodelrewrites.yaml",
         "inference.networking.k8s.io/bundle-version", "v1.5.0"),
    "llm-d.ai_inferenceobjectives.yaml":
        (ROUTER_MIRROR, "v0.10.0", "config/crd/bases/llm-d.ai_inferenceobjectives.yaml",
         "llm-d.ai/bundle-version", "v0.10.0"),
    "llm-d.ai_inferencemodelrewrites.yaml":
        (ROUTER_MIRROR, "v0.10.0", "config/crd/bases/llm-d.ai_inferencemodelrewrites.yaml",
         "llm-d.ai/bundle-version", "v0.10.0"),
}
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


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_bundle_version_is_upstreams(name: str) -> None:
    crd = yaml.safe_load((CRDS / name).read_text())
    *_, key, version = UPSTREAM[name]
    assert crd["metadata"]["annotations"][key] == version


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_fields_and_required_fields_are_upstreams(name: str) -> None:
    mirror, tag, path, *_ = UPSTREAM[name]
    if not mirror.exists():
        pytest.skip(f"the upstream mirror {mirror.name} is not on this machine (the CRDs were "
                    "compared with it; the tests below pin the differences that matter)")
    text = subprocess.run(["git", "-C", str(mirror), "show", f"{tag}:{path}"],
                          capture_output=True, text=True, check=True).stdout
    theirs = yaml.safe_load(text)
    ours = yaml.safe_load((CRDS / name).read_text())
    assert ours["spec"]["group"] == theirs["spec"]["group"]
    assert ours["metadata"]["name"] == theirs["metadata"]["name"]
    for version in theirs["spec"]["versions"]:
        (mine,) = [v for v in ours["spec"]["versions"] if v["name"] == version["name"]]
        mine_schema = mine["schema"]["openAPIV3Schema"]
        their_schema = version["schema"]["openAPIV3Schema"]
        assert field_paths(mine_schema) == field_paths(their_schema), version["name"]
        assert sorted(mine_schema["properties"].get("spec", {}).get("required", [])) == sorted(
            their_schema["properties"].get("spec", {}).get("required", [])), version["name"]


def test_every_crd_but_the_legacy_ones_is_compared_with_upstream() -> None:
    # v1alpha2 InferencePool and InferenceModel left upstream's bundles before v1.5
    assert {p.name for p in CRDS.glob("*.yaml")} - set(UPSTREAM) == {
        "inference.networking.x-k8s.io_inferencepools.yaml",
        "inference.networking.x-k8s.io_inferencemodels.yaml"}


def test_a_gie_v1_6_pool_needs_no_endpoint_picker_ref() -> None:
    schema = crd_schema("inference.networking.k8s.io", "inferencepools", "v1")
    jsonschema.validate({
        "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "targetPorts": [{"number": 8000}]},
    }, schema)
    with pytest.raises(jsonschema.ValidationError, match="'targetPorts' is a required"):
        jsonschema.validate({"spec": {"selector": {"matchLabels": {"app": "x"}}}}, schema)


@pytest.mark.parametrize("group", ["llm-d.ai", X])
def test_objective_and_rewrite_validate_in_both_groups(group: str) -> None:
    objective = {"apiVersion": f"{group}/v1alpha2", "kind": "InferenceObjective",
                 "metadata": {"name": "o"},
                 "spec": {"priority": 1, "poolRef": {"name": "pool"}}}
    jsonschema.validate(objective, crd_schema(group, "inferenceobjectives", "v1alpha2"))
    rewrite = {"apiVersion": f"{group}/v1alpha2", "kind": "InferenceModelRewrite",
               "metadata": {"name": "rw"},
               "spec": {"poolRef": {"name": "pool"},
                        "rules": [{"targets": [{"modelRewrite": "m"}]}]}}
    jsonschema.validate(rewrite, crd_schema(group, "inferencemodelrewrites", "v1alpha2"))


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
