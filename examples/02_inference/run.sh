#!/usr/bin/env bash
# Example 2 end to end: write the model with PyTorch, build against the installed FTorch with
# CMake, run the Fortran program. Usage: bash examples/02_inference/run.sh [python]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${1:-python}"
work="${FTORCH_EXAMPLE_DIR:-$(mktemp -d)}"
"$python" "$here/write_model.py" "$work"
cmake -S "$here/.." -B "$work/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$("$python" -m ftorch --cmake-prefix-path)" > "$work/cmake.log"
cmake --build "$work/build" > "$work/build.log"
"$work/build/inference" "$work"
