"""The AMQP 1.0 credit gate: the link credit a sender sees, spooled and refused transfers, and the
renumbering of sessions whose deliveries the proxy consumed. ``links``: the state (sessions,
links, their deliveries and spool captures, the frames the gate makes); ``gate``:
``CreditFlow`` (transfers, spool, dispositions), which owns one of each part, none standing
on another: ``sessions`` (their lifecycle), ``credit`` (windows, withholding, release,
deadline), ``runs`` (deliveries booked as runs), ``inflight`` (unsettled deliveries counted
against the window)."""
