"""The I/O layer: asyncio only here. Sockets, timers, threads, signals, the admin HTTP server.

Owns the listener and the relay (``relay``: feeds each connection's core with bytes and
``now``, and carries out what the core and its gate hand back), the process (``app``), the
flow supervisor that feeds the controller on timers and dispatches what it returns
(``supervisor``), the topology feed (``topology``), the proxy's own AMQP clients
(``amqp_client``, ``amqp10_client``), the management API, the spool service (group commit,
replay; it implements ``enforce.ports.SpoolPort``), the telemetry writer, TLS contexts.

May import: every layer below it (``ops``, ``enforce``, ``control``, ``spool``, ``wire``).
"""
