"""The protocol package both services share: Envoy ext_proc stream handling, response builders,
OpenAI request parsing, gRPC server bootstrap, logging, metrics and flag helpers.

Nothing in here knows about body-based routing or endpoint picking.
"""
