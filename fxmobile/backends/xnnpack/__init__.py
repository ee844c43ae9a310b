"""XNNPACK (CPU) backend: its rewrite passes and, in csrc/, its op registrations (fxmobile._C)."""
