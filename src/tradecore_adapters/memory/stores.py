"""The lifecycle of the in-memory stores: nothing to open or close, always ready."""

from __future__ import annotations


class InProcessStores:
    """``Stores`` for the memory adapter set: its data lives in this process's memory."""

    async def open(self) -> None:
        """Nothing to connect to."""

    async def ready(self) -> bool:
        """In-memory stores always answer."""
        return True

    async def close(self) -> None:
        """Nothing to release; the data goes with the process."""
