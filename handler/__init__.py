"""Inferentia2 LLM serving handler for TorchServe."""
