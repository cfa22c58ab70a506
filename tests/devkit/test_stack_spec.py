"""gateway-stack's config file: a P/D pool's layout, and each mistake named in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devkit.stack import DEFAULT_CONFIG, StackError, load_spec, pool_objects, sim_config

PD_EXAMPLE = DEFAULT_CONFIG.parent / "stack-pd.yaml"


def test_the_pd_example_lays_out_prefill_then_decode_pods() -> None:
    pool = load_spec(PD_EXAMPLE).pools[0]
    assert pool.servers == 4 and pool.decoders == ["127.0.10.3", "127.0.10.4"]
    assert pool.epp_config == PD_EXAMPLE.parent / "pd-epp-config.yaml"
    servers = sim_config(pool)["servers"]
    # Prefill servers on the pool port; decode servers beside their sidecar, on vllm_port.
    assert [(s["host"], s["port"], s["kv_transfer_config"]["kv_role"]) for s in servers] == [
        ("127.0.10.1", 8000, "kv_producer"), ("127.0.10.2", 8000, "kv_producer"),
        ("127.0.10.3", 8200, "kv_consumer"), ("127.0.10.4", 8200, "kv_consumer")]
    roles = [d["metadata"]["labels"].get("llm-d.ai/role") for d in pool_objects(pool)
             if d["kind"] == "Pod"]
    assert roles == ["prefill", "prefill", "decode", "decode"]
    assert len(set(pool.sidecar_metrics)) == 2


def test_a_pool_without_pd_has_no_roles_and_no_sidecars() -> None:
    pool = load_spec(DEFAULT_CONFIG).pools[0]
    assert pool.decoders == [] and pool.sidecar_metrics == []
    assert all("llm-d.ai/role" not in d["metadata"]["labels"] for d in pool_objects(pool)
               if d["kind"] == "Pod")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"servers": 4}, "pools[0]: give 'servers' or 'pd', not both"),
        ({"pd": {"prefill": 2, "decoders": 2}},
         "pools[0]: pd: unknown key(s) decoders (known: prefill, decode, vllm_port, link)"),
        ({"replicas": 2}, "pools[0]: unknown key(s) replicas (known: name, model, epp, "),
        ({"pd": {"prefill": 0, "decode": 2}}, "pools[0]: pd: prefill and decode need at least 1"),
        ({"pd": {"decode": "two"}}, "pools[0]: pd: decode must be an integer, got 'two'"),
        ({"pd": {"link": "pigeon"}}, "pools[0]: pd: link must be one of rdma, tcp"),
        ({"pd": [2, 2]}, "pools[0]: pd must be a mapping"),
        ({"epp_config": "nowhere.yaml"}, "pools[0]: epp_config: no file "),
    ],
)
def test_a_bad_pd_pool_is_named(tmp_path: Path, change: dict[str, object],
                                message: str) -> None:
    spec = yaml.safe_load(PD_EXAMPLE.read_text())
    spec["pools"][0].update(change)
    cfg = tmp_path / "stack.yaml"
    cfg.write_text(yaml.safe_dump(spec))
    with pytest.raises(StackError) as err:
        load_spec(cfg)
    assert str(err.value).startswith(f"{cfg}: {message}"), err.value


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bbrr": {"grpc_port": 9004}}, "unknown key(s) bbrr (known: gateway, bbr, pools, demo)"),
        ({"gateway": {"prot": 8080}}, "gateway: unknown key(s) prot (known: port, admin_port)"),
        ({"demo": {"request": 5}}, "demo: unknown key(s) request (known: requests, "),
        ({"bbr": {"grpc_port": 9004, "flag": ["-v"]}}, "bbr: unknown key(s) flag (known: "),
        ({"bbr": {"flags": {"v": 4}}}, "bbr.flags must be a list of arguments or a string"),
        ({"gateway": [8080]}, "gateway must be a mapping"),
    ],
)
def test_a_misspelt_key_anywhere_in_the_file_is_named(tmp_path: Path, change: dict[str, object],
                                                      message: str) -> None:
    spec = yaml.safe_load(DEFAULT_CONFIG.read_text())
    spec.update(change)
    cfg = tmp_path / "stack.yaml"
    cfg.write_text(yaml.safe_dump(spec))
    with pytest.raises(StackError) as err:
        load_spec(cfg)
    assert str(err.value).startswith(f"{cfg}: {message}"), err.value


def test_a_misspelt_epp_key_is_named(tmp_path: Path) -> None:
    spec = yaml.safe_load(DEFAULT_CONFIG.read_text())
    spec["pools"][1]["epp"]["metric_port"] = 1
    cfg = tmp_path / "stack.yaml"
    cfg.write_text(yaml.safe_dump(spec))
    with pytest.raises(StackError, match=r"pools\[1\]: epp: unknown key\(s\) metric_port"):
        load_spec(cfg)


def test_flags_pass_through_as_a_list_or_a_string(tmp_path: Path) -> None:
    spec = yaml.safe_load(DEFAULT_CONFIG.read_text())
    spec["bbr"]["flags"] = ["-v", 4, "--require-model=false"]
    spec["pools"][0]["epp"]["flags"] = "-v 4 --refresh-metrics-interval '100ms'"
    cfg = tmp_path / "stack.yaml"
    cfg.write_text(yaml.safe_dump(spec))
    loaded = load_spec(cfg)
    assert loaded.bbr_flags == ["-v", "4", "--require-model=false"]
    assert "flags" not in loaded.bbr and "flags" not in loaded.pools[0].epp
    assert loaded.pools[0].epp_flags == ["-v", "4", "--refresh-metrics-interval", "100ms"]
    assert loaded.pools[1].epp_flags == []
