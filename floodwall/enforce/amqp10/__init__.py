"""The AMQP 1.0 credit gate: the link credit a sender sees, spooled and refused transfers, and the
renumbering of sessions whose deliveries the proxy consumed. In layers: ``links`` (sessions,
links, their deliveries and spool captures, the frames the gate makes), ``sessions`` (their
lifecycle), ``credit`` (windows, withholding, release, deadline), ``gate`` (``CreditFlow``:
transfers, in-flight deliveries, spool, dispositions)."""
