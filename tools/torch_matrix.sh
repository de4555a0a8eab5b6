#!/usr/bin/env bash
# Build FTorch against another torch release and run a smoke subset of the tests with it.
#   bash tools/torch_matrix.sh 2.14.1                      (default subset)
#   bash tools/torch_matrix.sh 2.11.0 tests/test_math.py   (pytest arguments of your own)
#   bash tools/torch_matrix.sh --build-only 2.14.1         (the venv and the wheel, no tests)
#   bash tools/torch_matrix.sh --tests-only 2.14.1 [...]   (the tests, on what --build-only made)
# Everything goes outside the checkout, under $FTORCH_MATRIX_DIR (default /tmp/ftorch-matrix):
# a venv venv-torch<version> (reused when it has that torch), the build directory
# build-torch<version> and the wheel. The checkout's build/ and .venv are not touched.
#
# PyPI's Linux torch wheels are CUDA builds: they are built here as a user's `pip install .` builds
# them, with nothing but what `pip install torch` installed (no CUDA toolkit, no nvcc: FTorch's CMake
# takes the CUDA runtime from torch's NVIDIA packages). FTORCH_CUDA_ROOT=DIR builds against a CUDA
# toolkit of your own instead.
#
# The C++ layer is compiled at -O1 here (FTORCH_MATRIX_CXX_FLAGS, default "-O1 -DNDEBUG"): the
# script checks that FTorch builds and behaves with that torch, not its speed, and -O1 compiles the
# LibTorch-heavy sources ~2.5x faster than the release build's -O3 (CI builds two releases).
set -euo pipefail
stage=all
case "${1:-}" in
  --build-only) stage=build; shift ;;
  --tests-only) stage=tests; shift ;;
esac
[ $# -ge 1 ] || { echo "usage: $0 [--build-only | --tests-only] TORCH_VERSION [pytest args...]" >&2; exit 2; }
version="$1"
shift
repo="$(cd "$(dirname "$0")/.." && pwd)"
root="${FTORCH_MATRIX_DIR:-/tmp/ftorch-matrix}"
venv="$root/venv-torch$version"
build="$root/build-torch$version"
wheels="$root/wheels-torch$version"
py="$venv/bin/python"
mkdir -p "$root"
t0=$SECONDS
step() { echo "==> [torch $version, $((SECONDS - t0)) s] $*"; }

installed_torch() { "$py" -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null || true; }
# The venv with torch $version, and FTorch built against it and installed there.
build_and_install() {
  if [ ! -x "$py" ]; then
    step "creating $venv"
    python3 -m venv "$venv"
  fi
  case "$(installed_torch)" in
    "$version" | "$version"+*) step "torch $(installed_torch) already installed" ;;
    *)
      step "installing torch==$version and the build and test tools"
      "$py" -m pip install -q "torch==$version" "scikit-build-core==1.1.2" "cmake>=3.21" ninja fypp pytest numpy
      ;;
  esac

  cmake_defines=()
  if [ -n "${FTORCH_CUDA_ROOT:-}" ]; then
    cmake_defines=(--config-settings="cmake.define.CUDA_TOOLKIT_ROOT_DIR=$FTORCH_CUDA_ROOT"
                   --config-settings="cmake.define.CMAKE_CUDA_COMPILER=$FTORCH_CUDA_ROOT/bin/nvcc")
  fi

  step "building the wheel in $build"
  rm -rf "$wheels"
  PATH="$venv/bin:$PATH" "$py" -m pip wheel -q --no-build-isolation --no-deps -w "$wheels" \
    --config-settings="build-dir=$build" \
    --config-settings="cmake.define.CMAKE_CXX_FLAGS_RELEASE=${FTORCH_MATRIX_CXX_FLAGS:--O1 -DNDEBUG}" \
    ${cmake_defines[@]+"${cmake_defines[@]}"} "$repo"
  step "installing it"
  "$py" -m pip install -q --no-deps --force-reinstall "$wheels"/ftorch-*.whl
  PATH="$venv/bin:$PATH" "$py" -m ftorch doctor
}

if [ "$stage" != tests ]; then
  build_and_install
elif ! "$py" -c "import ftorch" 2>/dev/null; then
  echo "$0 --tests-only $version: no FTorch installed in $venv (run --build-only first)" >&2
  exit 2
fi
[ "$stage" != build ] || { step "built (tests not run: --build-only)"; exit 0; }

if [ $# -eq 0 ]; then
  # With gfortran 12 only (the compilers have their own tests); of the training packages, the
  # optimizers' trajectories (one package) and a model with random operations (dropout): each
  # package is a few AOTInductor compilations, the subset's main cost.
  set -- tests/test_math.py tests/test_function.py tests/test_train.py tests/test_compiled.py \
    tests/test_train_package.py \
    -k "not flang and not gfortran-11 and not (test_train_package.py and not (adam or dropout))"
fi
step "tests: $*"
cd "$repo"
# (its own pytest directory: CI runs this beside the suite, whose pytest cleans up old numbered ones)
PATH="$venv/bin:$PATH" FTORCH_TEST_USE_INSTALLED=1 "$py" -m pytest -q -p no:cacheprovider \
  --basetemp="$root/pytest-torch$version" "$@"
step "done"
