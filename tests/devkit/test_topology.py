"""The gateway layout builder: what it declares, and that the real Envoy accepts it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit import envoy as e
from devkit.topology import BBR_FILTER, EPP_FILTER, Pool, Topology, bootstrap


def two_pools(**kw: Any) -> Topology:
    return Topology(listen=18080, admin=19901, bbr_port=19004, pools=[
        Pool("llama", models=["llama-8b", "llama-chat"], epp_port=19002),
        Pool("qwen", models=["qwen-7b"], epp_port=19012),
    ], **kw)


def listener_of(cfg: dict[str, Any]) -> dict[str, Any]:
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    return dict(hcm["typed_config"])


def test_bbr_then_epp_then_router_with_a_route_per_model() -> None:
    hcm = listener_of(two_pools(not_found="no pool serves this model").bootstrap())
    names = [f["name"] for f in hcm["http_filters"]]
    assert names == [BBR_FILTER, EPP_FILTER, "envoy.filters.http.router"]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    matched = [(r["match"]["headers"][0]["string_match"]["exact"], r["route"]["cluster"],
                r["typed_per_filter_config"][EPP_FILTER]["overrides"]["grpc_service"])
               for r in routes[:-1]]
    assert matched == [
        ("llama-8b", "pool-llama", {"envoy_grpc": {"cluster_name": "epp-llama"}}),
        ("llama-chat", "pool-llama", {"envoy_grpc": {"cluster_name": "epp-llama"}}),
        ("qwen-7b", "pool-qwen", {"envoy_grpc": {"cluster_name": "epp-qwen"}}),
    ]
    last = routes[-1]
    assert last["direct_response"]["status"] == 404
    assert "llama-8b" in last["direct_response"]["body"]["inline_string"]
    assert last["typed_per_filter_config"][EPP_FILTER]["disabled"] is True


def test_modes_and_clusters() -> None:
    cfg = two_pools(mode="BUFFERED", tls=True).bootstrap()
    bbr, epp, _ = listener_of(cfg)["http_filters"]
    assert bbr["typed_config"]["processing_mode"]["request_body_mode"] == "BUFFERED"
    assert epp["typed_config"]["processing_mode"]["response_body_mode"] == "STREAMED"
    clusters = {c["name"]: c for c in cfg["static_resources"]["clusters"]}
    assert list(clusters) == ["bbr", "epp-llama", "pool-llama", "epp-qwen", "pool-qwen"]
    assert clusters["pool-qwen"]["type"] == "ORIGINAL_DST"
    assert "transport_socket" in clusters["epp-qwen"]


def test_a_pool_without_epp_is_a_static_cluster_and_no_epp_filter() -> None:
    topo = Topology(listen=18080, admin=19901, bbr_port=19004, pools=[
        Pool("a", models=["a"], cluster="a", endpoints=[("127.0.0.1", 18000)]),
        Pool("default", cluster="default", endpoints=[("127.0.0.1", 18001)]),
    ])
    hcm = listener_of(topo.bootstrap())
    assert [f["name"] for f in hcm["http_filters"]] == [BBR_FILTER, "envoy.filters.http.router"]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert [r["route"]["cluster"] for r in routes] == ["a", "default"]
    assert "headers" not in routes[-1]["match"]  # the catch-all comes last
    assert topo.clusters()[1]["type"] == "STATIC"


def test_the_real_envoy_validates_the_layout(tmp_path: Path) -> None:
    cfg = two_pools(not_found="no pool serves this model", runtime=e.GRACEFUL_CLOSE,
                    epp_forwarding=["envoy.lb.subset_hint"]).bootstrap()
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    done = subprocess.run([e.envoy_binary(), "--mode", "validate", "-c", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_pool_with_epp_and_known_pods_is_override_host_with_fallback_retries() -> None:
    topo = Topology(listen=18080, admin=19901, pools=[Pool(
        "pool", cluster="pool", epp_cluster="epp", epp_port=19002, num_retries=3,
        endpoints=[("127.0.0.1", 18000), ("127.0.0.2", 18000)], served_header="x-served")])
    cluster = topo.clusters()[1]
    policy = cluster["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    hosts = [ep["endpoint"]["address"]["socket_address"]["address"]
             for ep in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert hosts == ["127.0.0.1", "127.0.0.2"]
    route = topo.routes()[0]
    assert route["route"]["retry_policy"]["num_retries"] == 3
    assert route["response_headers_to_add"][0]["header"]["key"] == "x-served"
    # without known pods the EPP's pick goes to an ORIGINAL_DST cluster, with no retries
    plain = Topology(listen=18080, admin=19901, pools=[Pool("pool", epp_port=19002)])
    assert plain.clusters()[1]["type"] == "ORIGINAL_DST"
    assert "retry_policy" not in plain.routes()[0]["route"]


def _validate(cfg: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    done = subprocess.run([e.envoy_binary(), "--mode", "validate", "-c", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_epp_replicas_are_one_health_checked_ext_proc_cluster(tmp_path: Path) -> None:
    topo = Topology(listen=18080, admin=19901, pools=[Pool(
        "pool", cluster="pool", epp_cluster="epp", epp_port=19002,
        endpoints=[("127.0.0.1", 18000)], epp_replicas=[(19002, 19003), (19012, 19013)])])
    epp = topo.clusters()[0]
    ports = [ep["endpoint"]["address"]["socket_address"]["port_value"]
             for ep in epp["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    health = [ep["endpoint"]["health_check_config"]["port_value"]
              for ep in epp["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert (epp["name"], ports, health) == ("epp", [19002, 19012], [19003, 19013])
    assert epp["health_checks"][0]["grpc_health_check"] == {}
    # A stream that cannot connect to a (killed) replica is retried on another one, in the
    # filter and in the route's override alike.
    services = [topo.filters()[0]["typed_config"]["grpc_service"],
                topo.routes()[0]["typed_per_filter_config"][EPP_FILTER]["overrides"]
                ["grpc_service"]]
    for service in services:
        assert service["envoy_grpc"] == {"cluster_name": "epp"}
        assert "connect-failure" in service["retry_policy"]["retry_on"]
        assert service["retry_policy"]["retry_host_predicate"][0]["name"] == (
            "envoy.retry_host_predicates.previous_hosts")
    _validate(topo.bootstrap(), tmp_path)


def test_an_observing_service_keeps_the_round_robin_cluster() -> None:
    pods = [("127.0.0.1", 18000), ("127.0.0.2", 18000)]
    topo = Topology(listen=18080, admin=19901, pools=[Pool(
        "noop", cluster="pods", epp_cluster="noop", epp_port=19002, endpoints=pods,
        epp_picks=False)])
    assert [f["name"] for f in topo.filters()] == [EPP_FILTER]
    upstream = topo.clusters()[1]
    assert (upstream["name"], upstream["type"]) == ("pods", "STATIC")
    assert "retry_policy" not in topo.routes()[0]["route"]


def test_an_observing_service_needs_endpoints_to_balance() -> None:
    with pytest.raises(ValueError, match="epp_picks=False needs an epp_port and endpoints"):
        Pool("noop", epp_port=19002, epp_picks=False)


def test_several_layouts_share_one_envoy_and_their_common_clusters(tmp_path: Path) -> None:
    pods = [("127.0.0.1", 18000), ("127.0.0.2", 18000)]
    layouts = [
        Topology(listen=18080, admin=19901, name="direct",
                 pools=[Pool("direct", cluster="pods", endpoints=pods)]),
        Topology(listen=18081, admin=19901, name="noop", pools=[Pool(
            "noop", cluster="pods", epp_cluster="noop", epp_port=19002, endpoints=pods,
            epp_picks=False)]),
        Topology(listen=18082, admin=19901, name="epp", pools=[Pool(
            "pool", cluster="pool", epp_cluster="epp", epp_port=19012, endpoints=pods)]),
    ]
    cfg = bootstrap(layouts)
    listeners = cfg["static_resources"]["listeners"]
    assert [(lst["name"], lst["address"]["socket_address"]["port_value"])
            for lst in listeners] == [("direct", 18080), ("noop", 18081), ("epp", 18082)]
    assert [c["name"] for c in cfg["static_resources"]["clusters"]] == [
        "pods", "noop", "epp", "pool"]
    _validate(cfg, tmp_path)


def test_layouts_that_disagree_on_a_cluster_or_share_a_name_are_refused() -> None:
    a = Topology(listen=18080, admin=19901, name="a",
                 pools=[Pool("a", cluster="pods", endpoints=[("127.0.0.1", 18000)])])
    b = Topology(listen=18081, admin=19901, name="b",
                 pools=[Pool("b", cluster="pods", endpoints=[("127.0.0.2", 18000)])])
    with pytest.raises(ValueError, match="cluster 'pods' is declared differently"):
        bootstrap([a, b])
    with pytest.raises(ValueError, match="distinct names"):
        bootstrap([a, a])
