#!/usr/bin/env bash
# Build FTorch and run every GPU check of the suite on a machine with a CUDA build of torch and a
# GPU, where there may be no Fortran compiler and no network (a lent GPU machine).
#
# Usage: bash tools/gpu_check.sh [GFORTRAN_BUNDLE.tar.xz] [WHEEL_DIR]
#   GFORTRAN_BUNDLE  a relocatable gfortran 12 with OpenACC offloading to nvptx
#                    (tools/gpu_bundle.sh makes it and WHEEL_DIR on a Debian 12 machine); needed
#                    only when no gfortran is on PATH
#   WHEEL_DIR        a directory holding a fypp wheel; needed only when fypp is not installed;
#                    libyaml (TorchFort's configuration files) is taken from WHEEL_DIR/../yaml when
#                    that exists (gpu_bundle.sh puts it there) and no yaml.h is installed
# Environment: PYTHON (default python3), JOBS (pytest workers, default 8), LOG_DIR (where the logs
#   and the benchmark's results go, default bench/results), BENCH_REPS (default 5), DEADLINE
#   (seconds from this script's start: every step ends by then, each limit cut to what is left
#   less the 10 s a step may take to be killed; a step with under 20 s left is skipped and counted
#   as failed; default none), ONLY (names of the steps after the build to
#   run, e.g. "device_tests bench"; default all), DEVICE_TESTS (pytest node ids for device_tests
#   instead of the list below), BENCH_SIZES (bench/gpu.py --sizes, e.g. 0,1,2).
# Steps, in order of what matters most on a GPU; each has a time limit and a failing step does not
# stop the later ones (the exit status counts the failed steps):
#   1. build against the machine's torch, `python -m ftorch doctor`
#   2. the device tests: Fortran on cudaMalloc'd memory with CUDA-graph training steps
#      (tests/projects/gpu), the C device-path program on cuda (tensors, models, device memory
#      without a copy, FTorch's GPU idiom, a train step, a GPU checkpoint loaded on the CPU), the
#      CUDA cases of the CMake consumer, the OpenACC program (offloaded to the GPU), example 14,
#      data-parallel training on the GPU (2 MPI ranks; needs OpenMPI there)
#      the TorchFort API's models and RL systems on the GPU, a training package exported for CUDA
#      in the device program
#   3. host-device copies of FTorch's GPU idiom against torch's pinned and pageable copies
#      (bench/transfer.py, values checked), written to LOG_DIR/transfer.{md,json}; the GPU
#      benchmark (bench/gpu.py: training steps with and without CUDA graphs, FTorch against
#      PyTorch), written to LOG_DIR/gpu.{md,json}
#      node-shared inference for 1..16 ranks (bench/node_shared.py), data-parallel weak scaling
#      on 1, 2, 4, 8 ranks of the CPU cores (bench/distributed.py)
#   4. the rest of the examples, training, lifetime and consumer tests against the installed package
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-python3}"
jobs="${JOBS:-8}"
logs="${LOG_DIR:-$repo/bench/results}"
mkdir -p "$logs"
cd "$repo"
failed=0

step() {  # step NAME SECONDS COMMAND...: runs COMMAND with a time limit, its output into LOG_DIR/NAME.log
  local name=$1 limit=$2 start=$SECONDS rc
  shift 2
  if [ -n "${ONLY:-}" ] && [ "$name" != build ] && [[ " $ONLY " != *" $name "* ]]; then
    return 0
  fi
  if [ -n "${DEADLINE:-}" ] && [ $((DEADLINE - SECONDS - 15)) -lt "$limit" ]; then
    limit=$((DEADLINE - SECONDS - 15))
    if [ "$limit" -lt 20 ]; then
      echo "<== $name: skipped, ${limit}s left before DEADLINE"
      failed=$((failed + 1))
      return 1
    fi
  fi
  echo "==> $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  tail -n 25 "$logs/$name.log"
  echo "<== $name: exit $rc after $((SECONDS - start))s"
  [ "$rc" -eq 0 ] || failed=$((failed + 1))
  return "$rc"
}

if ! command -v gfortran >/dev/null; then
  bundle="${1:?no gfortran on PATH: pass a gfortran bundle (tools/gpu_bundle.sh makes one)}"
  mkdir -p /tmp/ftorch-gfortran
  tar xJf "$bundle" -C /tmp/ftorch-gfortran
  export PATH="/tmp/ftorch-gfortran/usr/bin:$PATH"
  export LD_LIBRARY_PATH="/tmp/ftorch-gfortran/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
gfortran --version | head -1
if ! "$py" -c "import fypp" 2>/dev/null; then
  "$py" -m pip install -q --no-index --find-links "${2:?fypp is not installed: pass a directory with its wheel}" fypp
fi
"$py" - <<'PY' || exit 1
import torch
print("torch", torch.__version__, "CUDA", torch.version.cuda)
if not torch.cuda.is_available():
    raise SystemExit("no CUDA device is visible to torch: nothing to check on a GPU here")
print("device:", torch.cuda.get_device_name(0))
PY

yaml_dir="$(cd "$(dirname "${2:-/nonexistent}")" 2>/dev/null && pwd)/yaml"
if [ -f "$yaml_dir/usr/include/yaml.h" ] && [ ! -f /usr/include/yaml.h ]; then
  export CMAKE_ARGS="${CMAKE_ARGS:-} -DFTORCH_YAML_INCLUDE_DIR=$yaml_dir/usr/include -DFTORCH_YAML_LIBRARY=$yaml_dir/usr/lib/x86_64-linux-gnu/libyaml.a"
fi
export FTORCH_TEST_USE_INSTALLED=1 CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
step build 400 "$py" -m pip install -v --no-build-isolation --no-deps "$repo" || exit 1
if grep -q "CUDA graphs left out" "$logs/build.log"; then
  echo "WARNING: this build has no CUDA graphs (see build.log): the CUDA-graph checks will fail; give the build a" \
       "CUDA toolkit of torch's release (CUDA_HOME) or nvidia-cuda-crt and nvidia-cuda-cccl wheels"
fi
step doctor 60 "$py" -m ftorch doctor
if [ -n "${DEVICE_TESTS:-}" ]; then
  read -r -a device_tests <<<"$DEVICE_TESTS"
else
  device_tests=(tests/test_gpu.py tests/test_openacc.py "tests/test_other_consumers.py::test_c_program_device_paths"
                tests/test_cmake_consumer.py -k "gpu or device or openacc or cuda"
                "tests/test_examples.py::test_example_runs[cuda_graph-gfortran]"
                "tests/test_distributed.py::test_data_parallel_on_the_gpu"
                "tests/test_distributed.py::test_node_shared_model_on_the_gpu"
                "tests/test_torchfort.py::test_torchfort_models_train_on_the_gpu"
                "tests/test_torchfort.py::test_cuda_graph_steps_equal_eager_steps"
                "tests/test_torchfort_rl.py::test_torchfort_rl_program_on_the_gpu")
fi
# PYTEST_ARGS: more pytest options for this step, e.g. "-v --timeout=150" (pytest-timeout: a test
# that hangs then fails with its traceback instead of taking the step's whole limit)
read -r -a pytest_args <<<"${PYTEST_ARGS:-}"
step device_tests 300 "$py" -m pytest -q -rs -n "$jobs" "${pytest_args[@]}" "${device_tests[@]}"
step transfer 200 "$py" bench/transfer.py --out "$logs"
step node_shared 300 "$py" bench/node_shared.py --out "$logs" --repeats "${NODE_SHARED_REPEATS:-1}"
step distributed 300 "$py" bench/distributed.py --out "$logs" --repeats 3 --more-ranks "${DDP_RANKS:-4,8}"
step bench 400 "$py" bench/gpu.py --out "$logs" --reps "${BENCH_REPS:-5}" ${BENCH_SIZES:+--sizes "$BENCH_SIZES"}
step suite 400 "$py" -m pytest -q -rs -n "$jobs" tests/test_other_consumers.py tests/test_examples.py \
  tests/test_train.py tests/test_cmake_consumer.py tests/test_lifetime.py
echo "failed steps: $failed"
exit "$failed"
