#!/usr/bin/env bash
# Sets up the environment if needed, then runs Coil's demo on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
exec .venv/bin/python -m coil.demo "$@"
