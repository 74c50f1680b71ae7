"""The wire layer: AMQP as bytes, with no I/O, no clock and no policy.

Owns protocol detection (``detect``), the contract between io/ and a protocol core
(``relaycore``), the two relay cores and their framing and codecs (``amqp091``, ``amqp10``),
the arithmetic of AMQP 1.0 credit and delivery ids, and the typed topology changes a core
reads off the frames it relays (``topology``); and, as another wire format read without
I/O, the Prometheus text format of the broker's metrics page (``prometheus``).

May import: nothing of floodwall above it (the standard library, pamqp). A core calls the
publish gate only through the Protocol its protocol package defines (``amqp091.hooks``,
``amqp10.hooks``), which ``floodwall.enforce`` implements and ``floodwall.io`` wires in.
"""
