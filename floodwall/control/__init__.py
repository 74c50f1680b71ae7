"""The control layer: shared, pure state behind every decision, one per process.

Owns the flow controller (which queues are policed and tripped, which channels and links are
blocked on which queues: ``controller``), queue depth (``depth``), pending lookups
(``lookups``), policies (``policy``: model, loader, engine, rendering) and the routing model
(``routing``: the exchange/binding model, matching, the management API loaders, the broker's
topology events, sync differences).

May import: ``floodwall.wire`` (value types only). No socket, file (except reading the one
policy file it is asked to load), clock, logger or asyncio: every entry point that needs the
time takes ``now``; what happens (trips, releases, freed channels) is returned as values.
"""
