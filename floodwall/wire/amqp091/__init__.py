"""Sans-IO AMQP 0-9-1: framing, errors, the relay core (``connection``), the declares and binds
it reads (``topology``) and the hooks through which it asks the publish gate (``hooks``)."""
