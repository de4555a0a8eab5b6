#!/usr/bin/env bash
# Example 6 end to end (the README's demo): write the untrained model with PyTorch, build against
# the installed FTorch with CMake, train it online inside the Fortran simulation, plot the loss.
# Usage: bash examples/06_online_training/run.sh [python] [steps]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${1:-python}"
steps="${2:-2000}"
work="${FTORCH_EXAMPLE_DIR:-$(mktemp -d)}"
"$python" "$here/write_model.py" "$work"
cmake -S "$here/.." -B "$work/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$("$python" -m ftorch --cmake-prefix-path)" > "$work/cmake.log"
cmake --build "$work/build" > "$work/build.log"
"$work/build/online_training" "$work" "$steps"
echo "loss curve: $("$python" -m ftorch plot-loss "$work/training.log" -o "$work/loss.png")"
