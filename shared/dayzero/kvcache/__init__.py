"""Paged KV cache: pools, block allocator, per-sequence block tables and transfer views."""

from .allocator import BlockAllocator, KVCacheFullError
from .manager import BlockAddress, KVCacheManager, SeqBlocks
from .pool import KVCacheSpec, KVPool, KVRegion

__all__ = ["BlockAddress", "BlockAllocator", "KVCacheFullError", "KVCacheManager", "KVCacheSpec", "KVPool",
           "KVRegion", "SeqBlocks"]
