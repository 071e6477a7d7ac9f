"""respflow's assembled graphs and drivers, the gateway, and the ``respflow`` CLI."""

from flows._decode import decode

__all__ = ["decode"]
