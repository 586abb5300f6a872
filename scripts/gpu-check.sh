#!/usr/bin/env bash
# GPU checks on a machine with a CUDA GPU: the array adapters' element-wise operations on cupy
# arrays and torch CUDA tensors, both through the staged ring (peers share the GPU), and the
# NCCL path when there are two GPUs or more; then benchmarks/gpu_allreduce.py (the staged ring
# against its bound: the host allreduce plus the two copies).
# Usage: scripts/gpu-check.sh [pytest args]   (PYTHON, default python3, needs cupy and torch;
# no network needed: the package is installed without build isolation)
# Finishes in well under 5 minutes on one GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
"$py" - <<'PY'
import cupy, numpy
print("cupy", cupy.__version__, "devices", cupy.cuda.runtime.getDeviceCount())
PY
"$py" -m pip install --quiet --no-deps --no-build-isolation -e . 2>/dev/null \
    || export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 300 "$py" -m pytest -q -p no:cacheprovider -m gpu tests/collectives/test_gpu.py \
    tests/collectives/test_arrays.py -rs "$@"
timeout 240 "$py" benchmarks/gpu_allreduce.py --nprocs 2,4 --sizes 4M,64M
