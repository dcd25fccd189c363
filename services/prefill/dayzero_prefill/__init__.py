"""dayzero prefill worker: batch 1, chunked; computes a prompt's KV and writes it into a decode worker."""
