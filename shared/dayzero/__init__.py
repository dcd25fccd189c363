"""dayzero: serving library for OpenAI's GPT-OSS models (model, weights, kernels, KV cache, transfer)."""

__version__ = "0.1.0"
