"""Bound models and analysis tools that are not runs of a scenario (issue #33): what no
ordering policy can beat on a burst (:mod:`bench.models.burst_bound`) and what the servers
alone allow under a sheddable flood (:mod:`bench.models.ceiling`)."""
