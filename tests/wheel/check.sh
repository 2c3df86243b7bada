#!/usr/bin/env bash
# A non-editable install, as users get it: builds a wheel from this checkout,
# installs it into a new virtual environment, and runs it from outside the
# source tree: a world-2 all_reduce and send/recv checked against local
# values, and the status tool, whose protobuf stubs must ship in the wheel.
#   make wheel-check        (PY=... picks the interpreter that builds the wheel)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$work/dist" .
torch_version=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "torch==$torch_version" "$work"/dist/torch_grpc_pg-*.whl
cp tests/wheel/smoke.py "$work/"
cd "$work"
"$work/venv/bin/python" smoke.py
