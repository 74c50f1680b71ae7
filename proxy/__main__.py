"""``python -m proxy`` is the ``floodwall`` command."""

from proxy.cli import main

main()
