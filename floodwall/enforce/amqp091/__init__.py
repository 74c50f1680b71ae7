"""The AMQP 0-9-1 publish gate: hold, refuse, signal, spool and release publishes per channel."""
