"""Queue policies: the version-1 YAML format (``loader``), the model (``model``, ``units``), the
pure trip/release engine (``engine``) and the effective policies for people (``render``).

Nothing here does I/O beyond reading the one policy file it is asked to load, and nothing
keeps time: the depth tracker, the gate and the I/O layer call in with figures and act on
the answers.

Defaults, for every field a policy or a ``defaults`` entry leaves out (a policy first takes
the ``defaults`` entry of its vhost, then these):

=================  ===========================================================
capacity           0 (no byte limit)
resume             = capacity of the same entry
max_messages       none (no count limit; ``0`` in the file means the same)
resume_messages    = max_messages of the same entry
overflow           hold (``spool`` acts as ``hold`` unless run with ``--spool-dir``)
deadline           30s
signal             auto
on_unknown_depth   keep
spool              max_bytes 1GiB, fsync group, group_commit_ms 10
=================  ===========================================================

``capacity``/``resume`` are inherited as a pair, and so are ``max_messages``/
``resume_messages``: an entry that sets a limit but not its resume level resumes at its own
limit, never at an inherited resume level.
"""

from floodwall.control.policy.engine import (
    decide,
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
    SPOOL_AVAILABLE,
    Fsync,
    Overflow,
    Policy,
    PolicyError,
    PolicySet,
    QueueLimits,
    Signal,
    SpoolSettings,
    UnknownDepth,
    glob_to_regex,
    set_spool_available,
)
from floodwall.control.policy.render import (
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
    "SPOOL_AVAILABLE",
    "Fsync",
    "Overflow",
    "Policy",
    "PolicyError",
    "PolicySet",
    "PolicyStore",
    "QueueLimits",
    "ReloadResult",
    "Signal",
    "SpoolSettings",
    "UnknownDepth",
    "decide",
    "format_bytes",
    "format_bytes_approx",
    "format_duration",
    "glob_to_regex",
    "load_policies",
    "parse_bytes",
    "parse_duration",
    "parse_policies",
    "render_policies",
    "set_spool_available",
]
