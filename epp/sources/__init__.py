"""What feeds the datastore. Each source parses raw objects with
:func:`epp.datastore.parse_object`, builds a snapshot with
:func:`epp.datastore.build_snapshot` and installs it with
:meth:`epp.datastore.Datastore.replace`. Today: a manifests file; Kubernetes comes next."""

from epp.sources.manifests import ManifestError, ManifestSource, load_snapshot

__all__ = ["ManifestError", "ManifestSource", "load_snapshot"]
