"""The spool on disk: records, per-queue segment logs, limits, recovery and inspection.

Flow-to-disk: per-queue append-only segment logs of publishes, recovered and replayed. The
one layer besides io/ that touches files; no asyncio, no sockets.

May import: ``floodwall.wire`` only (nothing of control, enforce, ops or io).
"""
