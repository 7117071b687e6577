"""Encoder families with Hugging Face parameter names."""
__all__ = []
