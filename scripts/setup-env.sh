#!/usr/bin/env bash
# Creates (once) the virtual environment .venv with Coil and its pinned dependencies.
# Idempotent: a second run only re-installs Coil itself (editable, so it is quick).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "coil: creating .venv" >&2
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch, triton, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') and triton.__version__ == '3.6.0' else 1)" 2>/dev/null; then
  echo "coil: installing torch==2.13.0 and triton==3.6.0" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" "triton==3.6.0"
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,remote]"
# tests/test_remote_cache.py starts its own redis-server (Debian's package); without root
# (CI) it is skipped there, and those tests skip saying so
if ! command -v redis-server >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "coil: installing redis-server (for the remote-cache tests)" >&2
  apt-get install -y -q redis-server >/dev/null 2>&1 || \
    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q redis-server >/dev/null 2>&1; } || \
    echo "coil: could not install redis-server; tests/test_remote_cache.py will skip" >&2
fi
# The model suite's public definitions (tests/models). torch stays pinned in the same command,
# else pip takes a newer (CUDA) torch for them; torchvision's wheel pins one torch release
# and comes without its dependencies (its C++ ops are not needed: see tests/models/imports.py).
if ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ('timm', 'transformers', 'torchvision')))"; then
  echo "coil: installing the model suite's definitions (timm, transformers, torchvision)" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" "triton==3.6.0" \
    "timm==1.0.31" "transformers==5.24.0"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "torchvision==0.28.0"
fi
