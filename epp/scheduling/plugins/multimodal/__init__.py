"""Multimodal scheduling plugins: encoder-cache affinity (llm-d-router v0.10)."""
