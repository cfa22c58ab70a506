"""Request control: the director that takes one request from parse to picked endpoint and
back, the extension points it calls (:mod:`epp.requestcontrol.plugin`) and the built-in
plugins at those points (:mod:`epp.requestcontrol.plugins`)."""

from epp.requestcontrol.director import Director, Pending, Routed, Shed

__all__ = ["Director", "Pending", "Routed", "Shed"]
