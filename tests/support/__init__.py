"""Helpers the tests import: processes, fake Kubernetes, gateway layouts, fixture bodies.

Conftest files only register fixtures (imported from here); no test imports a conftest.
"""
