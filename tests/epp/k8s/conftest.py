"""Fixtures for this room (their bodies live in ``tests.support.k8s``)."""

from tests.support.k8s import apiserver, kube  # noqa: F401
