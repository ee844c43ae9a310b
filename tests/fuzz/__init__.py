"""Differential fuzzing of fxmobile: random valid eager models, optimized and checked against eager.

- the generator: ``spec`` (what a drawn model is: values, blocks, the program), ``draw`` (the
  hypothesis strategies, which draw only valid models) and ``build`` (``FuzzModel``, the eager
  model that runs a program);
- ``dynamic``: blocks whose result depends on more than the input's values (branches on its
  layout, dtype or shape, random draws, seed calls, call counters);
- ``oracle``: the float64 anchor and the rounding-noise bound the optimized model must meet,
  and what NaN and infinities must do;
- ``probes``: the input the check runs beyond the example (NaN and infinities, another
  layout, another batch size);
- ``structure``: what the passes that ran promise about the optimized graph;
- ``check``: one model through one stage (``check_model``), and the hypothesis settings;
- ``programs``: hand-written programs the oracle was once too tight on.

The tests are ``tests/test_fuzz.py`` (the property test, and tests of the oracle itself),
``tests/test_fuzz_regressions.py`` (every failure the fuzzer found, as a small named model) and
``tests/test_no_mutation.py`` (the caller's model is never touched).
"""
