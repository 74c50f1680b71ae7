"""Dev tooling, apart from the product (not in the wheel): a private RabbitMQ (``devbroker``),
a floodwall child process (``devproxy``) and ``make demo`` (``demo``).

May import: anything of floodwall; nothing of floodwall imports it.
"""
