"""Endpoint picker (EPP): picks the model-server endpoint for each inference request.

Layout (dependency direction ``handlers → requestcontrol → scheduling → datastore``):

- ``datastore/`` — typed models (pool, endpoints, objectives, rewrites) and the live store;
- ``sources/``   — what feeds the datastore (a manifests file today, Kubernetes later);
- ``metrics/``   — the model-server metrics scraper and its engine dialects;
- ``scheduling/``— the pure scheduler: filters → weighted scorers → picker, per profile.
"""
