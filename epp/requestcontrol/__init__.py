"""Request control: the director that takes one request from parse to picked endpoint, and
the response handling on the way back."""

from epp.requestcontrol.director import Director, Routed

__all__ = ["Director", "Routed"]
