"""Queue policies: the version-1 YAML format (``loader``: every error of a file, with its line
and column), the model (``model``, ``units``), the pure trip/release engine (``engine``), the
effective policies for people (``render``) and the policies that are shadowed or overlap
(``overlaps``, ``floodwall check``'s warnings).

Nothing here does I/O beyond reading the one policy file it is asked to load, and nothing
keeps time: the depth tracker, the gate and the I/O layer call in with figures and act on
the answers.

Defaults, for every field a policy or a ``defaults`` entry leaves out (a policy first takes
the ``defaults`` entry of its vhost, then these):

===================  ===========================================================
capacity             0 (no byte limit)
resume               = capacity of the same entry
max_messages         none (no count limit; ``0`` in the file means the same)
resume_messages      = max_messages of the same entry
overflow             hold (``spool`` acts as ``hold`` unless run with ``--spool-dir``)
deadline             30s
signal               auto
on_unknown_depth     keep
mode                 enforce (``shadow``: computed, logged, counted; nothing held)
in_flight_allowance  auto (AMQP 1.0: ``floodwall.control.controller.in_flight_allowance``)
spool                max_bytes 1GiB, fsync group, group_commit_ms 10
===================  ===========================================================

``capacity``/``resume`` are inherited as a pair, and so are ``max_messages``/
``resume_messages``: an entry that sets a limit but not its resume level resumes at its own
limit, never at an inherited resume level.
"""

from floodwall.control.policy.engine import (
    should_trip,
)
from floodwall.control.policy.loader import (
    PolicyStore,
    ReloadResult,
    load_policies,
    parse_policies,
)
from floodwall.control.policy.model import (
    BUILTIN_DEFAULTS,
    DEFAULT_DEADLINE,
    EMPTY_POLICIES,
    FORMAT_VERSION,
    Fsync,
    Mode,
    Overflow,
    Policy,
    PolicyError,
    PolicySet,
    Problem,
    QueueLimits,
    Severity,
    Signal,
    SpoolSettings,
    UnknownDepth,
    glob_to_regex,
)
from floodwall.control.policy.overlaps import (
    Overlap,
    overlaps,
)
from floodwall.control.policy.render import (
    policy_document,
    render_policies,
)
from floodwall.control.policy.units import (
    format_bytes,
    format_bytes_approx,
    format_duration,
    parse_bytes,
    parse_duration,
)

__all__ = [
    "BUILTIN_DEFAULTS",
    "DEFAULT_DEADLINE",
    "EMPTY_POLICIES",
    "FORMAT_VERSION",
    "Fsync",
    "Mode",
    "Overflow",
    "Overlap",
    "Policy",
    "PolicyError",
    "PolicySet",
    "PolicyStore",
    "Problem",
    "QueueLimits",
    "ReloadResult",
    "Severity",
    "Signal",
    "SpoolSettings",
    "UnknownDepth",
    "format_bytes",
    "format_bytes_approx",
    "format_duration",
    "glob_to_regex",
    "load_policies",
    "overlaps",
    "parse_bytes",
    "parse_duration",
    "parse_policies",
    "policy_document",
    "render_policies",
    "should_trip",
]
