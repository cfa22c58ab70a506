"""What feeds the datastore. Each source parses raw objects with
:func:`epp.datastore.parse_object`, builds a snapshot with
:func:`epp.datastore.build_snapshot` and installs it with
:meth:`epp.datastore.Datastore.replace`.

Sources: the manifests file (:mod:`epp.sources.manifests`) and the Kubernetes API
(:mod:`epp.sources.kubernetes`). Both are a :class:`Source`. The Kubernetes module is
imported on demand so ``--manifests`` never loads the client. (Leader election, which is
not a source, is :mod:`epp.leader`.)"""

from typing import Protocol

from epp.sources.manifests import ManifestError, ManifestSource, load_snapshot


class Source(Protocol):
    """Keeps the datastore's snapshot current while :meth:`run` runs."""

    async def run(self) -> None:
        """Follow changes until cancelled."""


__all__ = ["ManifestError", "ManifestSource", "Source", "load_snapshot"]
