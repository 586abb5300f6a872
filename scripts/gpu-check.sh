#!/usr/bin/env bash
# GPU checks on a machine with a CUDA GPU: the array adapters' element-wise operations on cupy
# arrays and torch CUDA tensors, both through the staged ring (peers share the GPU), and the
# NCCL path when there are two GPUs or more.
# Usage: scripts/gpu-check.sh            (uses the python on PATH; needs cupy-cuda12x and torch)
# Finishes in well under 5 minutes on one GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
python - <<'PY'
import cupy, numpy
print("cupy", cupy.__version__, "devices", cupy.cuda.runtime.getDeviceCount())
PY
python -m pip install --quiet --no-deps -e . 2>/dev/null || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 300 python -m pytest -q -p no:cacheprovider -m gpu tests/collectives/test_gpu.py tests/collectives/test_arrays.py -rs "$@"
