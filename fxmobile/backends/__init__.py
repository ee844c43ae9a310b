"""Backends fxmobile targets (XNNPACK/CPU, Vulkan, Metal): one folder each, plus the op library.

``library`` loads ``fxmobile._C`` lazily and registers each backend's op family on demand; see
:func:`fxmobile.backends.library.ensure_registered`.
"""
