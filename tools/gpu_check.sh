#!/usr/bin/env bash
# Build FTorch and run every GPU check of the suite on a machine with a CUDA build of torch and a
# GPU, where there may be no Fortran compiler and no network (a lent GPU machine).
#
# Usage: bash tools/gpu_check.sh [GFORTRAN_BUNDLE.tar.xz] [WHEEL_DIR]
#   GFORTRAN_BUNDLE  a relocatable gfortran (../shared/device/gfortran_bundle.sh makes one on a
#                    Debian 12 machine); needed only when no gfortran is on PATH
#   WHEEL_DIR        a directory holding a fypp wheel (`pip download --no-deps -d DIR fypp`);
#                    needed only when fypp is not installed
# Environment: PYTHON (default python3), PYTEST_ARGS (extra pytest arguments, e.g. "-n 8").
# What runs: the build against the machine's torch, `python -m ftorch doctor`, then the tests that
# exercise devices -- the C device-path program on cuda (tensors, models, device memory without a
# copy, FTorch's GPU idiom, a train step, a GPU checkpoint loaded on the CPU), the Fortran program
# on cudaMalloc'd memory (tests/projects/gpu; also CUDA-graph training steps), the OpenACC program
# (tests/projects/openacc: on the GPU where the gfortran can offload to nvptx), the examples (which pick the GPU when there is one),
# training and the consumers -- each against the installed package; then the GPU benchmark
# (bench/gpu.py: training steps with and without CUDA graphs, FTorch against PyTorch), written to
# bench/results/gpu.{md,json}.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-python3}"
cd "$repo"

if ! command -v gfortran >/dev/null; then
  bundle="${1:?no gfortran on PATH: pass a gfortran bundle (see ../shared/device/gfortran_bundle.sh)}"
  mkdir -p /tmp/ftorch-gfortran
  tar xJf "$bundle" -C /tmp/ftorch-gfortran
  export PATH="/tmp/ftorch-gfortran/usr/bin:$PATH"
  export LD_LIBRARY_PATH="/tmp/ftorch-gfortran/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
gfortran --version | head -1
if ! "$py" -c "import fypp" 2>/dev/null; then
  "$py" -m pip install -q --no-index --find-links "${2:?fypp is not installed: pass a directory with its wheel}" fypp
fi
"$py" - <<'PY'
import torch
print("torch", torch.__version__, "CUDA", torch.version.cuda)
if not torch.cuda.is_available():
    raise SystemExit("no CUDA device is visible to torch: nothing to check on a GPU here")
print("device:", torch.cuda.get_device_name(0))
PY
echo "==> building FTorch against this torch"
"$py" -m pip install -q --no-build-isolation --no-deps "$repo"
"$py" -m ftorch doctor
echo "==> GPU checks"
# shellcheck disable=SC2086
FTORCH_TEST_USE_INSTALLED=1 "$py" -m pytest -q -rs ${PYTEST_ARGS:-} \
  tests/test_gpu.py tests/test_other_consumers.py tests/test_examples.py tests/test_train.py \
  tests/test_cmake_consumer.py tests/test_lifetime.py tests/test_openacc.py
echo "==> GPU benchmark (bench/gpu.py)"
"$py" bench/gpu.py --out bench/results
