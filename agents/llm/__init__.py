"""An LLM as a policy: the model, sampling, KV cache, speed settings, loading, decode loop."""
