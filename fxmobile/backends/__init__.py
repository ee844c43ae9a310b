"""Backends fxmobile targets (XNNPACK/CPU, Vulkan, Metal): one folder each, plus the op library.

``library`` registers every op family ``fxmobile._C`` provides when fxmobile is imported (and
``ensure_registered`` on demand, idempotently); see :mod:`fxmobile.backends.library`.
"""
