#!/usr/bin/env bash
# Set up everything on a fresh Debian/Ubuntu machine and run the demo:
#   - Fortran compilers (gfortran; gfortran-11 and flang-19 too when available) and pkg-config, via apt if missing
#   - OpenMPI (mpif90, mpirun) for data-parallel training (FTORCH_WITH_MPI=0 to skip)
#   - a virtual environment .venv with the torch of pyproject.toml (its one pin) and the build/test tools
#   - FTorch itself, built against that torch
#   - the demo: a Fortran simulation training a TorchScript MLP online (examples/06_online_training)
# Usage: bash tools/quickstart.sh            (FTORCH_SKIP_DEMO=1 to only install;
#                                             FTORCH_QUICKSTART_STAGE=system: only the system packages)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${FTORCH_VENV:-$repo/.venv}"
cd "$repo"

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

need=()
command -v gfortran >/dev/null || need+=(gfortran)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v make >/dev/null || need+=(make)
[ -e /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)  # the C++ unit tests (tests/unit)
[ -e /usr/include/yaml.h ] || need+=(libyaml-dev)  # TorchFort configuration files (src/cpp/torchfort_config.cpp)
if [ "${FTORCH_WITH_GFORTRAN11:-1}" = 1 ] && ! command -v gfortran-11 >/dev/null; then
  need+=(gfortran-11)  # tests/test_lifetime.py runs with gfortran 11, 12 and flang 19
fi
if [ "${FTORCH_WITH_FLANG:-1}" = 1 ] && ! command -v flang-new-19 >/dev/null; then
  need+=(flang-19)
fi
if [ "${FTORCH_WITH_FLANG:-1}" = 1 ] && [ ! -e /usr/lib/llvm-19/lib/libomp.so ]; then
  need+=(libomp-19-dev)  # OpenMP runtime for flang (tests/test_threads.py)
fi
if [ "${FTORCH_WITH_MPI:-1}" = 1 ] && ! command -v mpif90 >/dev/null; then
  need+=(openmpi-bin libopenmpi-dev)  # tests/test_distributed.py, examples/10_data_parallel
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "==> installing system packages: ${need[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
[ "${FTORCH_QUICKSTART_STAGE:-all}" != system ] || exit 0

if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv"
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
# The project's one torch pin: pyproject.toml's build requirement.
torch_pin=$(grep -o '"torch==[^"]*"' "$repo/pyproject.toml" | tr -d '"')
echo "==> installing $torch_pin and build tools into $venv"
"$py" -m pip install -q "$torch_pin" "scikit-build-core==1.1.2" "cmake>=3.21" ninja "fpm==0.12.0" fypp \
  pytest numpy matplotlib "ford~=7.0"  # ford: API reference, tools/build_docs.py (uses FORD 7's Python API)

echo "==> building and installing FTorch"
PATH="$venv/bin:$PATH" "$py" -m pip install -q --no-build-isolation "$repo"
PATH="$venv/bin:$PATH" "$py" -m ftorch doctor

if [ "${FTORCH_SKIP_DEMO:-0}" != 1 ]; then
  echo "==> demo: a Fortran simulation trains a TorchScript model online"
  PATH="$venv/bin:$PATH" FTORCH_EXAMPLE_DIR="$repo/build/demo" bash "$repo/examples/06_online_training/run.sh" "$py"
fi
