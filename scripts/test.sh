#!/usr/bin/env bash
# Sets up the environment if needed, then runs Coil's test suite.
#
# With no arguments (what CI runs) a second pass follows: the differential tests again,
# through the Triton GPU plugin under Triton's interpreter on CPU tensors, into a fresh Coil
# cache; then every Triton kernel they generated is compiled ahead of time for Hopper (sm_90)
# in a process without the interpreter. Each step runs whatever the one before gave; the
# script fails if any step does. Arguments go to pytest and run the first pass only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
status=0
# Two pytest-xdist workers (CI's machine has two cores; each worker keeps its own Coil
# cache, see tests/conftest.py), and the slowest tests listed, so CI's time (kept well under
# 30 minutes) stays visible.
.venv/bin/python -m pytest -q -n 2 --durations=15 || status=$?

triton_cache=$(mktemp -d -t coil-triton-pass.XXXXXX)
trap 'rm -rf "$triton_cache"' EXIT
echo "coil: differential tests through the Triton plugin (interpreted), then AOT for sm_90" >&2
COIL_CACHE_DIR="$triton_cache" COIL_TEST_BACKEND=triton TRITON_INTERPRET=1 \
  .venv/bin/python -m pytest -q -n 2 -p no:logging tests/test_compile.py tests/test_training.py tests/test_opinfo.py tests/test_loop_order.py tests/test_conv_bias.py \
  || status=$?
env -u TRITON_INTERPRET .venv/bin/python -m coil_cuda_triton.aot "$triton_cache" || status=$?
exit "$status"
