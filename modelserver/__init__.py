"""What the EPP, the P/D sidecar and the simulator share with the model servers beyond the
OpenAI HTTP API: vLLM's KV-cache events (``kvevents``), the prefill/decode transfer
(``pd``) and multimodal items in chat content (``multimodal``)."""
