"""respflow's assembled graphs and drivers, the gateway, and the ``respflow`` CLI."""

from flows._decode import decode
from flows._replay import relay_bytes

__all__ = ["decode", "relay_bytes"]
