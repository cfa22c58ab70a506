"""Long forms of the fault scenarios in ``tests/system/reliability/test_faults.py``: one of four
servers killed under load, repeated ``--rounds`` times, with the figures printed as JSON
(requests lost per kill, seconds from kill to the last failure, seconds from revival to the
first request it serves).

    python -m bench.faults --rounds 10 --workers 16
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from devkit.reliability.faultkit import SimFleet, load, start_sim_gateway


def kill_round(fleet: SimFleet, url: str, workers: int, pod: int, down: float) -> dict[str, Any]:
    """Kill ``pod`` under load for ``down`` seconds; what it cost."""
    with load(url, workers, max_tokens=30) as running:
        time.sleep(1.5)
        killed_at = time.monotonic()
        fleet.kill(pod, revive_after=down)
        time.sleep(down + 3.0)
    failed = [r for r in running.results if r.status != 200]
    back = [r.start for r in running.results
            if r.start > killed_at + down and r.pod == f"pod-{pod}"]
    return {"requests": len(running.results), "lost": len(failed),
            "last_failure_after_kill_s": round(max((r.start for r in failed), default=killed_at)
                                               - killed_at, 3),
            "rejoin_after_revival_s": round(min(back) - killed_at - down, 3) if back else None}


def main() -> None:
    ap = argparse.ArgumentParser(prog="bench.faults", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--down", type=float, default=3.0, help="seconds a killed pod stays down")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="faults-"))
    fleet = SimFleet(4, workdir).start()
    gw = start_sim_gateway(workdir, fleet)
    try:
        rounds = [kill_round(fleet, gw.url(), args.workers, i % 4, args.down)
                  for i in range(args.rounds)]
    finally:
        gw.stop()
        fleet.stop()
    print(json.dumps({"rounds": rounds,
                      "lost_total": sum(r["lost"] for r in rounds),
                      "requests_total": sum(r["requests"] for r in rounds)}, indent=2))


if __name__ == "__main__":
    main()
