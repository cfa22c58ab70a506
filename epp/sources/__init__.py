"""What feeds the datastore. Each source parses raw objects with
:func:`epp.datastore.parse_object`, builds a snapshot with
:func:`epp.datastore.build_snapshot` and installs it with
:meth:`epp.datastore.Datastore.replace`.

Sources: the manifests file (:mod:`epp.sources.manifests`) and the Kubernetes API
(:mod:`epp.sources.kubernetes`; :mod:`epp.sources.leader` for active-passive replicas). The
Kubernetes modules are imported on demand so ``--manifests`` never loads the client."""

from epp.sources.manifests import ManifestError, ManifestSource, load_snapshot

__all__ = ["ManifestError", "ManifestSource", "load_snapshot"]
