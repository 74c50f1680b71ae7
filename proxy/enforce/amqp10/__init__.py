"""The AMQP 1.0 credit gate: the link credit a sender sees, spooled and refused transfers,
and the renumbering of sessions whose deliveries the proxy consumed."""
