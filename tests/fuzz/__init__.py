"""Differential fuzzing of fxmobile: a generator of random valid eager models (``models``).

The fuzz tests themselves are ``tests/test_fuzz.py`` (optimized against eager, anchored in
float64, plus structural checks) and ``tests/test_no_mutation.py`` (the caller's model is never
touched).
"""
