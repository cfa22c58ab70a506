"""The EPP's ext_proc servicer: a thin state machine over :class:`epp.requestcontrol.Director`."""
