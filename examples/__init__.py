"""Runnable, tested examples of respflow flows."""
