"""A half-minute soak in the default run (``python -m bench.soak --minutes 30`` is the long
one): steady load through the whole gateway, no memory, fd, thread or error growth."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.soak import run_soak
from devkit.reliability.faultkit import SimFleet, start_sim_gateway
from devkit.reliability.gateway import Gateway

pytestmark = [pytest.mark.envoy, pytest.mark.serial]

#: Half a minute at 55 requests/s: the same ~1,650 requests as the minute at 30/s it was, so
#: a per-request leak grows RSS as much; sampling every 0.5 s keeps the slope's noise per
#: request where it was (the slope's error shrinks with the samples as the shorter span
#: widens it). It was 55 s at 30/s: 43% of make test's serial phase.
SECONDS = 30
RATE = 55


@pytest.fixture
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    fleet = SimFleet(4, tmp_path_factory.mktemp("soak-fleet")).start()
    gw = start_sim_gateway(tmp_path_factory.mktemp("soak-gw"), fleet)
    yield gw
    gw.stop()
    fleet.stop()


#: The per-request RSS slope this short run can tell from noise (issue 31, item 12). The 5%
#: bound alone on ~1,650 requests misses anything under ~3 KB per request: a deliberate
#: 1 KiB/request leak in BBR grew it 1.6% (passes) but measured 1,323 B/request here (fails);
#: leak-free runs measured 123-219 B/request for BBR, up to 541 for the EPP (noise). Finer
#: leaks (the 130 B/request grpc.aio one) need ``python -m bench.micro rss``.
MAX_BYTES_PER_REQUEST = 1000


def test_half_minute_soak_grows_no_memory_fds_threads_or_errors(gateway: Gateway) -> None:
    report = run_soak(gateway, SECONDS, rate=RATE, window=SECONDS / 3, sample_every=0.5)
    assert report.requests > SECONDS * RATE * 0.9
    assert report.errors == 0, report.window_errors
    assert report.problems(max_bytes_per_request=MAX_BYTES_PER_REQUEST) == [], {
        s: (report.growth(s), report.bytes_per_request(s)) for s in report.samples}
