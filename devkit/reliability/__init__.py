"""A two-pool gateway (Envoy, BBR, EPPs) and a simulated fleet with fault switches, started as
real processes: what the reliability tests, the fault runs and the soak share."""
