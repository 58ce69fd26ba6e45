"""The oldest keys of a walk that goes in no age order, in bounded memory."""

from __future__ import annotations

from typing import Any


class Oldest:
    """The `size` oldest of the keys added, in bounded memory (at most twice `size` held):
    the batch of a scan pass whose walk does not go oldest first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.held: list[tuple[Any, Any]] = []
        self.more = False  # more than `size` were added
        self.younger: Any = None  # once `size` are held: a key this old or younger is not kept

    def add(self, age: Any, key: Any) -> None:
        if self.younger is not None and not age < self.younger:
            self.more = True
            return
        self.held.append((age, key))
        if len(self.held) >= 2 * self.size:
            self._cut()

    def _cut(self) -> None:
        self.held.sort(key=lambda p: p[0])
        if len(self.held) > self.size:
            del self.held[self.size:]
            self.more = True
        if len(self.held) == self.size:
            self.younger = self.held[-1][0]

    def last(self) -> tuple[Any, Any]:
        """The age and key of the youngest kept (after `keys`)."""
        return self.held[-1]

    def full(self) -> bool:
        """More than `size` were added."""
        return self.more or len(self.held) > self.size

    def keys(self) -> list[Any]:
        """The oldest first."""
        self._cut()
        return [k for _, k in self.held]
