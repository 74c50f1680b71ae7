"""The operations layer: what an operator configures and sees.

Owns the settings (``config``), log lines (``logs``: the one place typed events become
lines), Prometheus collectors (``metrics``, ``flow_metrics``) and telemetry records
(``telemetry``, pure).

May import: ``floodwall.enforce``, ``floodwall.control``, ``floodwall.spool``,
``floodwall.wire``. Not ``floodwall.io`` (io uses ops) nor asyncio.
"""
