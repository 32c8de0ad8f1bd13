#!/usr/bin/env bash
# The GPU check: the Triton kernels' correctness on the device, the GPU target grid, then a short
# 2-arm x 1-seed x 50-step compare on the GPU (and on 2 processes, DDP over NCCL, with 2 GPUs).
# Run from the repository root on a machine with CUDA, PyTorch with CUDA and Triton installed
# (and Liger-Kernel, for the peer comparison):
#     bash benchmarks/gpu-check.sh [OUT]      (OUT defaults to benchmarks/gpu)
# About 6 minutes on one recent GPU. Record the figures in benchmarks/RESULTS.md (GPU section).
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
# 3. A compare on the GPU (the triton backend, CUDA allocator's peak memory), then on 2 GPUs.
throughput() {
  "$python" - "$1" <<'PY'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1], "runs").glob("*/summary.json")):
    s = json.loads(path.read_text())
    tps = s.get("tokens_per_s")
    shown = f"{tps:,.0f} tokens/s" if tps else "no throughput"
    print(f"{s['run_id']}: {s['status']}, {shown} on {s.get('world_size', 1)} process(es), "
          f"peak {(s.get('peak_memory_bytes') or 0) / 2**20:,.0f} MiB per rank")
PY
}
rm -rf "$out/compare1" "$out/compare2"
"$python" -m normlab compare --device cuda --seeds 1 --steps 50 --warmup 5 --no-report \
  --out "$out/compare1"
throughput "$out/compare1"
if [ "$("$python" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  "$python" -m normlab compare --device cuda --seeds 1 --steps 50 --warmup 5 --no-report \
    --nproc-per-node 2 --out "$out/compare2"
  throughput "$out/compare2"
fi
