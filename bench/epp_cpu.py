"""The EPP's own CPU cost: CPU-seconds per request and per 1,000 streamed output tokens,
beside the no-op ext_proc floor on the same stack, each under the same CPU budget (a pod's
limit: ``--cpus``, a cgroup quota or a pinned core, see :mod:`bench.cpubudget`).

One Envoy, one listener per contender (FULL_DUPLEX_STREAMED both ways, as upstream runs it;
``--mode``),
echo pods that stream ``k`` one-token SSE events ``--token-gap-ms`` apart. Each contender's
process CPU time (user + system, every thread; ``/proc``, not wall time) is read around each
closed-loop run, less what it spends idle (metric scrapes, timers: measured first, reported
apart). Two token counts per round give the fit ``CPU per request = a + b·k``: ``a`` is the
cost of one request, ``b`` the cost of one streamed token. Rounds alternate the order.

``--split`` samples the EPP with py-spy during one extra streamed run and says where its main
thread's time goes (ext_proc messages, parsing, scheduling, scraping, response handling, flow
control, and gRPC with the event loop, whose native code py-spy sees as the loop's own time),
and how much ran on other threads (gRPC core's poller). ``--tracing`` adds the EPP with
tracing on at upstream's default sampling (``parentbased_traceidratio`` 0.1, OTLP/gRPC to a
real receiver in this process) and its throughput and CPU per request over the untraced
EPP's, paired by round (target >= 0.95x throughput). ``--bbr`` adds BBR, placed like the
floor (it sees every request and picks nothing; the pods are a round-robin cluster): its
"/ floor" column is BBR's overhead (this was ``bench.micro bbr``); ``--mode BUFFERED`` runs
every contender with a buffered request body (and a streamed response).

    python -m bench.epp_cpu [--seconds 4] [--rounds 3] [--concurrency 32] [--tokens 8,64]
                            [--cpus 1] [--scrape-pods 8,32] [--baseline-tree DIR] [--split]
                            [--tracing] [--bbr] [--mode BUFFERED] [--save FILE] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.contenders import TUNED_CONFIG, Epp, SimFleet
from bench.cpubudget import CpuBudget, cpu_seconds
from bench.harness import PODS, cpu_load, echo_pool, epp_cmd, interleaved, start_extproc, stop
from bench.stats import Interval, bootstrap_median
from devkit import envoy as e
from devkit.otlp import OtlpReceiver
from devkit.topology import Pool, Topology, bootstrap

TRACED = "EPP tracing on (10% sampled)"
IDLE_SECONDS = 3.0

#: Where a sample of the EPP's main thread goes: the innermost frame whose file matches.
CATEGORIES = (
    ("flow control", ("epp/flowcontrol/",)),
    ("scheduling", ("epp/scheduling/",)),
    ("scraping", ("epp/datalayer/", "epp/metrics/")),
    ("response handling", ("epp/requestcontrol/response.py", "epp/handlers/")),
    ("parsing", ("shared/openai.py", "epp/requestcontrol/plugins/parser")),
    ("request control", ("epp/requestcontrol/",)),
    ("ext_proc messages (stream state machine, answers)",
     ("shared/extproc.py", "shared/responses.py")),
)
#: Samples in no Python frame of ours: grpc.aio's Cython calls and the event loop (uvloop).
NATIVE = "gRPC and the event loop (native code under the loop)"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--tokens", default="8,64", help="two streamed token counts (default 8,64)")
    p.add_argument("--token-gap-ms", type=float, default=2.0)
    p.add_argument("--cpus", type=float, default=1.0,
                   help="CPU budget of each ext_proc process; 0 for none (default 1)")
    p.add_argument("--scrape-pods", default="8,32",
                   help="pool sizes whose idle scraping cost is measured against simulator "
                        "pods (vLLM-shaped /metrics pages), comma-separated; '' for none")
    p.add_argument("--baseline-tree", type=Path, default=None, metavar="DIR",
                   help="also run the default profile from another checkout (e.g. a "
                        "`git worktree` of the last release), in the same rounds")
    p.add_argument("--tracing", action="store_true",
                   help="also an EPP with tracing on at upstream's default sampling (10%%), "
                        "exporting OTLP to a receiver in this process")
    p.add_argument("--bbr", action="store_true", help="also BBR, placed like the floor")
    p.add_argument("--mode", default="FULL_DUPLEX_STREAMED",
                   choices=("FULL_DUPLEX_STREAMED", "BUFFERED"), help="request body mode")
    p.add_argument("--split", action="store_true", help="where the EPP's CPU goes (py-spy)")
    p.add_argument("--save", type=Path, default=None, metavar="FILE",
                   help="write the medians as JSON (the twin's --epp-cost reads it)")
    p.add_argument("--quick", action="store_true", help="one short round (CI smoke)")
    args = p.parse_args()
    args.tokens = sorted(int(t) for t in args.tokens.split(","))
    if len(args.tokens) != 2 or args.tokens[0] == args.tokens[1]:
        p.error("--tokens takes two different counts, e.g. 8,64")
    args.scrape_pods = [int(n) for n in args.scrape_pods.split(",") if n]
    if args.quick:
        args.seconds, args.rounds, args.scrape_pods = 1.0, 1, args.scrape_pods[:1]
    return args


def save(args: argparse.Namespace, medians: dict[str, dict[str, float]],
         scrapes: dict[int, float]) -> None:
    """The run's medians (CPU seconds; idle as a fraction of a CPU) with how they were made;
    ``scrape_per_pod``: the median over pool sizes of the idle CPU per simulator pod."""
    args.save.write_text(json.dumps({
        "command": "python -m bench.epp_cpu " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": [round(x, 1) for x in psutil.getloadavg()],
        "cpus": args.cpus, "tokens": args.tokens, "contenders": medians,
        "scrape_idle": {str(n): r for n, r in scrapes.items()},
        "scrape_per_pod": statistics.median(r / n for n, r in scrapes.items())
        if scrapes else medians["EPP default profile"]["idle"] / len(PODS)},
        indent=1) + "\n")


def stream_body(work: Path, tokens: int) -> Path:
    path = work / f"stream-{tokens}.json"
    path.write_bytes(json.dumps({
        "model": "m", "max_tokens": tokens, "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Tell me about Envoy. " * 40}]}).encode())
    return path


def measure(pid: int, idle_rate: float, url: str, body: Path,
            args: argparse.Namespace) -> tuple[float, dict[str, Any]]:
    """CPU-seconds per request of one closed-loop run, idle cost removed."""
    stats = cpu_load(url, body, args.concurrency, args.seconds, [pid])
    return (stats["cpu"][0] - idle_rate * stats["wall"]) / max(1, stats["total"]), stats


def scraping(args: argparse.Namespace, work: Path) -> dict[int, float]:
    """The EPP's idle CPU (default profile, under the budget) with pools of simulator pods:
    what scraping every pod's vLLM-shaped /metrics every 50 ms costs, by pool size."""
    rates = {}
    for n in args.scrape_pods:
        epp = Epp("epp-default")
        epp.cpus = args.cpus
        fleet = SimFleet(work / f"fleet-{n}", size=n).start()
        try:
            with epp.running(fleet, work / f"scrape-{n}"):
                time.sleep(1.0)   # past start-up
                c0, t0 = cpu_seconds(epp.pid), time.monotonic()
                time.sleep(IDLE_SECONDS)
                rate = (cpu_seconds(epp.pid) - c0) / (time.monotonic() - t0)
        finally:
            fleet.stop()
        rates[n] = rate
    return rates


def split(pid: int, url: str, body: Path, args: argparse.Namespace, work: Path) -> list[str]:
    """Sample ``pid`` with py-spy during one run: shares of its main thread's samples per
    :data:`CATEGORIES`, and the CPU of its other threads."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    raw = work / "py-spy.txt"
    proc = psutil.Process(pid)
    before = {t.id: t.user_time + t.system_time for t in proc.threads()}
    sampler = subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--format", "raw", "--output", str(raw),
         "--duration", str(int(args.seconds) + 1), "--rate", "500", "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cpu_load(url, body, args.concurrency, args.seconds)
    sampler.wait(60)
    after = {t.id: t.user_time + t.system_time for t in proc.threads()}
    used = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    main = used.pop(pid, 0.0)
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines() if raw.exists() else []:
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        counts[next((name for f in reversed(frames) for name, keys in CATEGORIES
                     if any(k in f for k in keys)), NATIVE)] += int(n)
    total = sum(counts.values()) or 1
    others = sum(used.values())
    lines = ["| where (main thread, py-spy samples) | share |", "|---|---:|"]
    lines += [f"| {name} | {n / total:.0%} |" for name, n in counts.most_common()]
    lines.append(f"\nMain thread {main:.2f} CPU-s, other threads (gRPC core) {others:.2f} CPU-s "
                 f"({others / max(1e-9, main + others):.0%}).")
    return lines


def main() -> None:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-epp-cpu-"))
    _, backend_port, backend = echo_pool(work, args.token_gap_ms)
    (work / "tuned.yaml").write_text(TUNED_CONFIG)
    bodies = [stream_body(work, k) for k in args.tokens]
    commands = {"no-op ext_proc (floor)": [sys.executable, "-m", "bench.noop_extproc"],
                "EPP default profile": epp_cmd(work),
                "EPP tuned profile": epp_cmd(work, "--config-file", str(work / "tuned.yaml"))}
    trees: dict[str, Path] = {}
    envs: dict[str, dict[str, str]] = {}
    receiver = OtlpReceiver(count_only=True).start() if args.tracing else None
    if receiver is not None:  # answers as quickly as a collector
        commands[TRACED] = epp_cmd(work, "--tracing=true")
        envs[TRACED] = {"OTEL_TRACES_EXPORTER": "otlp",
                        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                        "OTEL_TRACES_SAMPLER_ARG": "0.1"}
    if args.bbr:
        commands["BBR"] = [sys.executable, "-m", "bbr.main", "--secure-serving=false"]
    if args.baseline_tree is not None:
        name = f"EPP default profile ({args.baseline_tree.name})"
        commands[name] = commands["EPP default profile"]
        trees[name] = args.baseline_tree.resolve()
    pods = [(ip, backend_port) for ip in PODS]
    admin = e.free_port()
    procs, topologies, urls, pids = [backend], [], {}, {}
    costs: dict[str, dict[str, float]] = {}
    how = "none (whole machine)"
    with contextlib.ExitStack() as stack:
        for i, (name, cmd) in enumerate(commands.items()):
            proc, (grpc, _) = start_extproc(work, f"contender-{i}", cmd,
                                            metrics="bench.noop_extproc" not in cmd,
                                            cwd=trees.get(name), env_extra=envs.get(name))
            procs.append(proc)
            pids[name] = proc.pid
            if args.cpus:
                budget = stack.enter_context(CpuBudget(args.cpus))
                budget.add(proc.pid)
                how = budget.how
            listen = e.free_port()
            topologies.append(Topology(
                listen=listen, admin=admin, name=f"c{i}", mode=args.mode, pools=[Pool(
                    f"c{i}", cluster=f"pods{i}", epp_cluster=f"ext{i}", epp_port=grpc,
                    endpoints=pods, epp_picks="epp.main" in cmd)]))
            urls[name] = f"http://127.0.0.1:{listen}/v1/chat/completions"
            e.wait_for_port(grpc, timeout=60)
        try:
            e.wait_for_port(backend_port, timeout=60, host=PODS[0])
            with e.Envoy(bootstrap(topologies), admin_port=admin, workdir=work / "envoy"):
                report = run(args, pids, urls, bodies, work, costs)
        finally:
            stop(procs)
            if receiver is not None:
                receiver.stop()
    if receiver is not None:
        report.append(f"Spans received from the traced EPP: {receiver.count}")
    rates = scraping(args, work)
    if rates:
        report += ["", "The EPP's idle CPU, scraping pools of simulator pods:", "",
                   "| simulator pods | idle CPU (scrapes every 50 ms) | per pod |",
                   "|---:|---:|---:|",
                   *(f"| {n} | {r:.1%} | {r / n:.2%} |" for n, r in rates.items())]
    if args.save is not None:
        save(args, costs, rates)
    load_avg = psutil.getloadavg()
    print("\n".join([
        f"Workload: closed loop, {args.concurrency} connections, {args.seconds:g} s x "
        f"{args.rounds} rounds per contender and token count; {args.tokens[0]} and "
        f"{args.tokens[1]} streamed tokens per request, {args.token_gap_ms:g} ms apart; 4 echo "
        f"pods; {args.mode} request bodies. CPU budget per ext_proc process: {args.cpus:g} "
        f"CPU ({how}). Load average after the run {load_avg[0]:.1f}, {load_avg[1]:.1f}.", "",
        *report]))


def run(args: argparse.Namespace, pids: dict[str, int], urls: dict[str, str],
        bodies: list[Path], work: Path, costs: dict[str, dict[str, float]]) -> list[str]:
    """The rounds; the medians go into ``costs``, the report lines are returned."""
    idle: dict[str, float] = {}
    starts = {name: cpu_seconds(pid) for name, pid in pids.items()}
    quiet = 1.0 if args.quick else IDLE_SECONDS
    time.sleep(quiet)
    for name, pid in pids.items():
        idle[name] = (cpu_seconds(pid) - starts[name]) / quiet
    k1, k2 = args.tokens

    def one_round(rnd: int, name: str) -> dict[str, Any]:
        c1, s1 = measure(pids[name], idle[name], urls[name], bodies[0], args)
        c2, s2 = measure(pids[name], idle[name], urls[name], bodies[1], args)
        b = (c2 - c1) / (k2 - k1)
        print(f"round {rnd + 1} {name:24s} {c1 * 1e3:6.2f} / {c2 * 1e3:6.2f} ms CPU per "
              f"request ({k1}/{k2} tokens), {s2['rps']:6.0f} req/s, errors "
              f"{s1['errors'] + s2['errors']:.0f}", file=sys.stderr)
        return {"per_tok": b, "per_req": c1 - b * k1, "rps": s2["rps"], "p50": s2["p50_ms"],
                "p99": s2["p99_ms"]}

    res = interleaved(list(pids), args.rounds, one_round)
    per_req, per_tok, rps, p50, p99 = ({n: [r[k] for r in rs] for n, rs in res.items()}
                                       for k in ("per_req", "per_tok", "rps", "p50", "p99"))

    def iv(xs: list[float], scale: float) -> Interval:
        m = bootstrap_median(xs)
        return Interval(m.median * scale, m.lo * scale, m.hi * scale, m.n)

    costs.update({name: {"per_request": statistics.median(per_req[name]),
                         "per_token": statistics.median(per_tok[name]),
                         "idle": idle[name], "rps": statistics.median(rps[name])}
                  for name in pids})
    floor = "no-op ext_proc (floor)"
    lines = [f"| contender | CPU ms per request | CPU µs per streamed token | idle CPU | "
             f"req/s ({k2} tokens) | / floor | p50 ms | p99 ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in pids:
        ratio = bootstrap_median([a / b for a, b in zip(rps[name], rps[floor], strict=True)])
        lines.append(f"| {name} | {iv(per_req[name], 1e3)} | {iv(per_tok[name], 1e6)} | "
                     f"{idle[name]:.1%} | {statistics.median(rps[name]):.0f} | {ratio} | "
                     f"{statistics.median(p50[name]):.2f} | {statistics.median(p99[name]):.2f} |")
    if TRACED in pids:
        r = bootstrap_median([a / b for a, b in zip(rps[TRACED], rps["EPP default profile"],
                                                    strict=True)])
        c = bootstrap_median([a / b for a, b in zip(per_req[TRACED], per_req[
            "EPP default profile"], strict=True) if b > 0])
        lines += ["", f"Tracing on / off, paired by round: throughput {r}, CPU per request {c}"]
    if args.split:
        name = "EPP default profile"
        lines += ["", f"Where the {name}'s CPU goes ({k2}-token streams):", "",
                  *split(pids[name], urls[name], bodies[1], args, work)]
    return lines


if __name__ == "__main__":
    main()
