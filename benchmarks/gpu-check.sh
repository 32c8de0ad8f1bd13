#!/usr/bin/env bash
# The GPU check: the Triton kernels' correctness on the device, then the GPU target grid.
# Run from the repository root on a machine with CUDA, PyTorch with CUDA and Triton installed
# (and Liger-Kernel, for the peer comparison):
#     bash benchmarks/gpu-check.sh [OUT]      (OUT defaults to benchmarks/gpu)
# About 5 minutes on one recent GPU. Record the figures in benchmarks/RESULTS.md (GPU section).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/gpu}"
python="${PYTHON:-python}"
"$python" -c "import torch, triton; assert torch.cuda.is_available(), 'no CUDA device'; \
print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
export MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# 1. Correctness: every Triton kernel, forward and every gradient, against float64 truth.
"$python" -m pytest -q -x -p no:cacheprovider tests/kernels/test_triton_kernels.py
# 2. The GPU targets: bf16 and fp16 at D >= 2048 (fp32 for reference), every installed peer.
"$python" -m normlab bench --device cuda --ops rms,layer,add_rms,ada_rms \
  --dims 2048,4096,8192 --dtypes bf16,fp16,fp32 --reps 20 --out "$out"
echo "results: $out/bench.csv, $out/bench.json, $out/bench.png"
