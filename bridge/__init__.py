"""qbridge: legacy database queues into NServiceBus SQL-transport tables, exactly once."""

__version__ = "0.1.0"
