"""Queue journals: the interface a queue writes through, and its implementations."""

from ._interface import Item, Journal, MemoryJournal

__all__ = ["Item", "Journal", "MemoryJournal"]
