"""Sans-IO AMQP 1.0: type codec, performatives, framing, addresses, credit and delivery-id
arithmetic, the relay core (``connection``) and the hooks through which it asks the credit
gate (``hooks``)."""
