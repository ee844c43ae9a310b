"""Rewrites of the exported ATen graph that let ExecuTorch's XNNPACK delegate take every op."""
