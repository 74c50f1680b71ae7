"""Dev tooling, apart from the product (not in the wheel): a private RabbitMQ (``devbroker``),
a floodwall child process (``devproxy``), ``make demo`` (``demo``) and the container images
of ``make image`` and the pod tests (``image``).

May import: anything of floodwall; nothing of floodwall imports it.
"""
