"""The twin's encode stage (issue #29): ``bench.twin.pd.simulate(..., encode=E)`` sends each
unique image to an encode server, whose engine encodes it once and then finds it in its
encoder cache; the advisor sweeps E/PD and E/P/D fleets for a multimodal workload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import main
from bench.twin.advisor import fleets
from bench.twin.pd import shape, simulate
from bench.workloads import RequestSpec
from sim.profiles import H100_8B

#: A slow encoder and a cheap load, so the encode leg stands out in TTFT.
PROFILE = H100_8B.with_overrides({"encode_time_per_image": 0.5,
                                  "ec_load_time_per_image": 0.002})


def chat(at: float, *urls: str) -> RequestSpec:
    content: list[dict[str, Any]] = [{"type": "text", "text": "what is in this picture? " * 8}]
    content += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return RequestSpec(at, "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": content}],
        "max_tokens": 8})


def test_a_chat_request_counts_its_image_placeholders_and_unique_items() -> None:
    s = shape(chat(0, "https://i.example/a.png", "https://i.example/b.png",
                   "https://i.example/a.png"))
    assert len(s.items) == 2                   # the repeated image is one item
    assert s.prompt > 2 * 225                  # 225 placeholders a 640 x 360 image
    assert all(tokens >= 225 for _, tokens in s.items)


def test_an_encoder_cache_hit_skips_the_encoder_cost() -> None:
    # 1 encoder + 1 prefill-decode server (E/PD), idle between the two requests: the second
    # finds the image in the encoder's cache (no 0.5 s encode) and in the PD server's
    # (no 2 ms load), and is otherwise the same request.
    first, again = simulate(0, 1, 0, None, encode=1, profile=PROFILE,
                            specs=[chat(0, "https://i.example/x.png"),
                                   chat(10, "https://i.example/x.png")])
    assert first.ttft - again.ttft == pytest.approx(0.5 + 0.002, abs=1e-6)


def test_an_image_is_encoded_once_per_encoder() -> None:
    # Two requests at once with one image: the least-loaded pick puts them on different
    # encoders, and each encodes it. A third, later, goes to the first encoder: a hit.
    url = "https://i.example/y.png"
    a, b, c = sorted(simulate(0, 2, 0, None, encode=2, profile=PROFILE,
                              specs=[chat(0, url), chat(0, url), chat(10, url)]),
                     key=lambda s: s.arrival)
    assert a.ttft > 0.5 and b.ttft > 0.5
    assert c.ttft < 0.5 - 0.1
    # The encode leg is a step of its own before the prefill (not the server's own encode).
    alone = simulate(0, 2, 0, None, profile=PROFILE, specs=[chat(0, url)])[0]
    assert a.ttft > alone.ttft + PROFILE.prefill_overhead
    # A new image on the same, now idle, fleet pays the encoder again.
    d = simulate(0, 2, 0, None, encode=2, profile=PROFILE,
                 specs=[chat(0, url), chat(10, "https://i.example/z.png")])[1]
    assert d.ttft == pytest.approx(a.ttft, abs=0.05)


def test_without_encoders_the_server_encodes_in_its_step() -> None:
    # Aggregated and P/D: the (prefill) server runs the encoder itself, once per image.
    for prefill, decode, threshold in ((2, 0, None), (1, 1, 16)):
        first, again = simulate(0, prefill, decode, threshold, profile=PROFILE,
                                specs=[chat(0, "https://i.example/x.png"),
                                       chat(10, "https://i.example/x.png")])
        assert first.ttft > 0.5 > again.ttft


def test_e_p_d_fleets_of_a_size() -> None:
    assert fleets(3, False) == [(0, 0), (0, 1), (0, 2)]
    assert fleets(3, True) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0)]


def test_advise_lists_e_pd_and_e_p_d_splits_for_a_multimodal_workload(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scn = tmp_path / "tiny-epd.yaml"
    scn.write_text("""
title: tiny E/P/D
fleet: {roles: {prefill: 1, decode: 2}, profile: h100-llama8b}
workload: {use: multimodal, duration: 5}
contenders:
- aggregated
- {name: pd, pd: {threshold: 16}}
seeds: [0]
loads: [0.3]
""")
    assert main(["advise", str(scn), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    for row in ("| aggregated (3) |", "| 1P+2D", "| 1E+2PD", "| 1E+1P+1D", "| 2E+1PD"):
        assert row in out
    advised = out.strip().splitlines()[-1].removeprefix("advice: ")
    assert f"| {advised} **advised** |" in out
    # --splits takes E/P fleets too.
    assert main(["advise", str(scn), "--jobs", "1", "--splits", "1/1"]) == 0
    out = capsys.readouterr().out
    assert "| 1E+1P+1D" in out and "| 1P+2D" not in out
