"""A virtual-time twin of the routing comparison: the real EPP scheduler in front of the
simulator's engine model, in a discrete-event loop instead of real processes.

    python -m bench.twin                       # make bench-twin: 4 workloads x 10 seeds x {8, 32}
    python -m bench.twin --config my-epc.yaml --servers 32 --workload shared-prefix --load 0.9

Pieces: :mod:`bench.twin.loop` (events: arrivals, engine steps, scrapes, in-flight
accounting), :mod:`bench.twin.baselines` (round-robin, random, least-request),
:mod:`bench.twin.epp_adapter` (the EPP's own config parser, plugins, datastore and director -
the only module that imports ``epp``), :mod:`bench.twin.cli` (matrix, tables, plots,
RESULTS.md). What it models and what it leaves out: ``docs/benchmarks.md``.
"""
