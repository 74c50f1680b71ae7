"""``python -m floodwall`` is the ``floodwall`` command."""

from floodwall.cli import main

main()
