"""The enforcement layer: per-connection decisions on publishes (0-9-1) and transfers (1.0).

Owns the one decision both protocols take (``decision.decide``: pass, hold, reject or spool),
the gates that translate it into frames per protocol (``amqp091``, ``amqp10``), their typed
events (``events``), the commands they hand to io/ (``commands``: frames for the client or the
broker, events), the counters they keep (``counters``), the spool port they write through
(``ports``) and the channel and link phases as transition tables (``states``).

May import: ``floodwall.control``, ``floodwall.wire``, ``floodwall.spool.records`` (the record
value). No clock, logger, file or socket: every entry point takes ``now``; output goes to
the outbox.

Where the restructuring stands (issue 13): the two gates are here (``amqp091.gate``,
``amqp10.gate``, and which 0-9-1 clients get ``channel.flow``: ``amqp091.clients``); the
shared ``decide``, typed events, commands, counters, the spool port and the state tables
are its next phases, and until then the gates still log and the cores still build them
(the import-linter contracts list those exceptions).
"""
