"""dayzero decode worker: continuous batching over the engine; KV arrives from prefill workers."""
