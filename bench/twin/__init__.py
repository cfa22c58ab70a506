"""A virtual-time twin of the routing comparison: the real EPP scheduler in front of the
simulator's engine model, in a discrete-event loop instead of real processes.

    python -m bench run shared-prefix                 # a scenario in virtual time (the default)
    python -m bench run mine.yaml --servers 32 --loads 0.9   # mine.yaml: your EPC as a contender

Pieces: :mod:`bench.twin.loop` (the one engine - events: arrivals, engine steps, scrapes,
in-flight accounting, response hooks; on a virtual-time event loop when the EPP's admitters
wait), :mod:`bench.twin.baselines` (round-robin, random, least-request),
:mod:`bench.twin.epp_adapter` (the EPP's own config parser, plugins, datastore and director -
the only module that imports ``epp``); :mod:`bench.runner` plays scenarios through them.
What it models and what it leaves out: ``docs/benchmarks.md``.
"""
