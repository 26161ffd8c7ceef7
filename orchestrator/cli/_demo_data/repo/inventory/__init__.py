"""A tiny stock-keeping library (the fleet demo's sample repository)."""

from inventory.store import Item, Store

__all__ = ["Item", "Store"]
