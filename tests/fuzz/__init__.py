"""A fuzzer for Coil: random straight-line tensor programs (hypothesis) mixing Coil kernels,
ATen fallbacks, library calls, views and in-place updates over random strides, channels_last
and storage offsets, compiled with ``backend="coil"`` and compared with eager, forward and
backward.

* ``programs.py`` — the program model (op records that print as Python) and the strategy;
* ``ops.py`` — the op families and their weights (``ops_compute.py``, ``ops_data.py``,
  helpers in ``choices.py``);
* ``harness.py`` — run, take gradients, compare (pasted into every repro script);
* ``repro.py`` — standalone repro scripts;
* ``runner.py`` — check one program, minimise a failure, and the command line for long runs
  (``python -m tests.fuzz.runner --examples 2000 --seed N``).

CI runs ``tests/test_fuzz.py``."""
