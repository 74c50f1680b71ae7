"""The enforcement layer: per-connection decisions on publishes (0-9-1) and transfers (1.0).

Owns the one decision both protocols take (``decision.decide``: pass, hold, reject or spool),
the gates that translate it into frames per protocol (``amqp091``, ``amqp10``), their typed
events (``events``), the commands they hand to io/ (``commands``: frames for the client or the
broker, events), the counters they keep (``counters``), the spool port they write through
(``ports``), what they may assemble in memory for it (``capture``), what a gate's parts share
(``shared.GateContext``) and the phases of a 0-9-1 channel (its lifecycle, its publishes'
content) and of a 1.0 link (its credit, its delivery) as transition tables (``states``).

May import: ``floodwall.control``, ``floodwall.wire``, ``floodwall.spool.records`` (the record
value). No clock, logger, file or socket: every entry point takes ``now``; output goes to
the outbox.
"""
