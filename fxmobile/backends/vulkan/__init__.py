"""Vulkan backend: its rewrite passes and, under csrc/, its op registrations for fxmobile._C."""
