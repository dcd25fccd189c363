"""Block allocator: hands out physical block ids of one pool, with leak accounting."""

from __future__ import annotations

from collections import deque


class KVCacheFullError(RuntimeError):
    """Not enough free KV blocks for a request (the caller may retry later, queue, or refuse it)."""


class BlockAllocator:
    """Free list of block ids ``[0, num_blocks)``. Every id is either free or used exactly once;
    ``allocate`` is all-or-nothing and ``free`` refuses ids that are not in use (double free)."""

    def __init__(self, num_blocks: int, name: str = "kv") -> None:
        if num_blocks < 0:
            raise ValueError(f"{name}: num_blocks must be >= 0, got {num_blocks}")
        self.name = name
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError(f"{self.name}: cannot allocate {n} blocks")
        if n > len(self._free):
            raise KVCacheFullError(
                f"{self.name} KV pool full: need {n} block(s), {len(self._free)} free of {self.num_blocks}")
        out = [self._free.popleft() for _ in range(n)]
        self._used.update(out)
        return out

    def free(self, blocks: list[int]) -> None:
        bad = [b for b in blocks if b not in self._used]
        if bad or len(set(blocks)) != len(blocks):
            raise ValueError(f"{self.name}: freeing block(s) not in use (double free?): {sorted(set(bad) or blocks)}")
        for b in blocks:
            self._used.remove(b)
            self._free.append(b)
