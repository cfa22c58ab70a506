"""``dcgm-data-source`` + ``dcgm-extractor`` against the simulator's DCGM-exporter page, and
the v0.10 HTTP source parameters (``interval``, TLS files) of the other sources."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devkit.manifests import pool_manifests
from epp.config.builtins import builtin_registry
from epp.datalayer.custom_metrics import ScalarAttributes
from epp.datastore import Datastore
from epp.datastore.objects import parse_object
from epp.datastore.snapshot import build_snapshot
from sim import start_fleet
from tests.support.sim import tiny

PAGE = """\
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",pod="pod-a"} 40
DCGM_FI_DEV_GPU_UTIL{gpu="1",pod="pod-a"} 85
DCGM_FI_DEV_GPU_UTIL{gpu="2",pod="pod-b"} 99
"""


def plugin(type_name: str, **params: Any) -> Any:
    return builtin_registry().create(type_name, "", params)


def gpu_util(view: Any) -> float | None:
    attrs = view.attribute(ScalarAttributes)
    return attrs.get("GPUUtilization/dcgm-extractor") if attrs else None


def test_extractor_keeps_its_pods_samples_takes_the_max_and_normalizes(make_view) -> None:
    ex = plugin("dcgm-extractor")
    view = make_view(1)
    view.endpoint = type(view.endpoint)(**{**_fields(view.endpoint), "pod_name": "pod-a"})
    ex.extract(PAGE, view, 0.0)
    assert gpu_util(view) == pytest.approx(0.85)
    unlabelled = make_view(2)
    ex.extract('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 12\n', unlabelled, 0.0)
    assert gpu_util(unlabelled) == pytest.approx(0.12)
    ex.extract("other_metric 1\n", unlabelled, 0.0)
    assert gpu_util(unlabelled) is None  # no sample: no attribute


def _fields(obj: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def test_dcgm_source_on_the_node_address_scrapes_the_pods_host_ip(make_view) -> None:
    view = make_view(1)
    on_node = type(view.endpoint)(**{**_fields(view.endpoint), "host_ip": "10.9.8.7"})
    view.endpoint = on_node
    assert plugin("dcgm-data-source", useNodeAddress=True).url(view) == \
        "http://10.9.8.7:9400/metrics"
    assert plugin("dcgm-data-source").url(view).startswith(f"http://{on_node.address}:9400")
    view.endpoint = type(view.endpoint)(**{**_fields(view.endpoint), "host_ip": ""})
    assert plugin("dcgm-data-source", useNodeAddress=True).url(view) == ""  # never scraped


def test_pods_host_ip_reaches_their_endpoints() -> None:
    from epp.datastore import parse_object
    from epp.datastore.snapshot import endpoints_for
    from tests.support.views import pod, pool_v1

    raw = pod("p", "10.0.0.5")
    raw["status"]["hostIP"] = "192.168.1.2"
    pool = parse_object(pool_v1())
    (endpoint,) = endpoints_for(pool, [parse_object(raw)])  # type: ignore[arg-type,list-item]
    assert (endpoint.address, endpoint.host_ip) == ("10.0.0.5", "192.168.1.2")


def test_dcgm_source_refuses_bad_values(tmp_path: Path) -> None:
    from shared.plugins import PluginError

    for params, why in (({"port": 0}, "port"), ({"path": "metrics"}, "path"),
                        ({"clientCertPath": str(tmp_path / "c.pem")}, "set both"),
                        ({"caCertPath": str(tmp_path / "ca.pem")}, "no such file")):
        with pytest.raises(PluginError, match=why):
            plugin("dcgm-data-source", **params)


def test_http_sources_take_v010_interval_and_tls_parameters(tmp_path: Path) -> None:
    assert plugin("models-data-source", interval="5s").params.refresh_interval == 5.0
    assert plugin("metrics-data-source", interval="1s").config.interval == 1.0
    assert plugin("dcgm-data-source", interval="1s").interval == 1.0
    from shared.plugins import PluginError

    with pytest.raises(PluginError, match="caCertPath"):
        plugin("metrics-data-source", caCertPath=str(tmp_path / "none.pem"))


async def test_source_scrapes_the_simulators_dcgm_page_into_the_attribute() -> None:
    async with start_fleet([tiny(name="sim-a"), tiny(name="sim-b")]) as fleet:
        a, b = fleet.servers
        b.faults.update({"gpu_util_percent": 70})
        port = a.port
        docs = pool_manifests("pool", [("sim-a", "127.0.0.1")], port)
        objects = [o for d in docs if (o := parse_object(d)) is not None]
        ds = Datastore()
        ds.replace(build_snapshot(objects, pool_name="pool", pool_namespace="default"))
        source = plugin("dcgm-data-source", port=port, path="/dcgm/metrics")
        source.add_extractor(plugin("dcgm-extractor"))
        async with aiohttp.ClientSession() as session:
            await source.poll_once(ds, session)
        (view,) = ds.views()
        assert gpu_util(view) == 0.0  # idle simulator: no batch slot running
        docs_b = pool_manifests("pool", [("sim-b", "127.0.0.1")], b.port)
        ds.replace(build_snapshot([o for d in docs_b if (o := parse_object(d)) is not None],
                                  pool_name="pool", pool_namespace="default"))
        source = plugin("dcgm-data-source", port=b.port, path="/dcgm/metrics")
        source.add_extractor(plugin("dcgm-extractor"))
        async with aiohttp.ClientSession() as session:
            await source.poll_once(ds, session)
        (view,) = ds.views()
        assert gpu_util(view) == pytest.approx(0.70)
