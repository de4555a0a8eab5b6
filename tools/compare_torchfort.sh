#!/usr/bin/env bash
# Trains the configurations of tests/test_torchfort.py through TorchFort's C API twice -- with
# NVIDIA TorchFort itself (built here, CPU only, from a source tree you provide) and with this
# package -- and compares the losses and outputs. Not run by CI (it cannot fetch TorchFort).
#   bash tools/compare_torchfort.sh TORCHFORT_SOURCE_DIR [WORK_DIR]
# Needs: the venv of this repository with FTorch installed, OpenMPI, yaml-cpp (libyaml-cpp-dev).
set -euo pipefail
src=$(cd "$1" && pwd)
work=${2:-/tmp/torchfort-compare}
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
mkdir -p "$work"
torch_cmake=$("$py" -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'share', 'cmake'))")

if [ ! -f "$work/torchfort-build/lib/libtorchfort.so" ]; then
  cmake -S "$src" -B "$work/torchfort-build" -G Ninja -DTORCHFORT_ENABLE_GPU=OFF -DTORCHFORT_BUILD_FORTRAN=OFF \
    -DTORCHFORT_YAML_CPP_ROOT=/usr -DYAML_CPP_LIBRARY=/usr/lib/x86_64-linux-gnu/libyaml-cpp.so \
    -DCMAKE_PREFIX_PATH="$torch_cmake" -DCMAKE_BUILD_TYPE=Release
  cmake --build "$work/torchfort-build" --target torchfort
fi

# The configurations and the float64 TorchScript model of the test suite.
"$py" - "$work" "$repo" <<'PY'
import sys, pathlib, torch
work, repo = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
sys.path.insert(0, str(repo / "tests"))
import test_torchfort as t
torch.manual_seed(5)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
torch.jit.script(net).save(str(work / "f8_model.pt"))
for name, cfg in t.CONFIGS.items():
    (work / f"{name}.yaml").write_text(t._to_yaml(cfg).replace("{dir}", str(work)))
(work / "configs.txt").write_text("".join(f"{n}\n" for n in t.CONFIGS))
PY

torchlib=$("$py" -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
mpiinc=$(mpicxx --showme:compile)
g++ -std=c++17 -O1 "$repo/tools/torchfort_compare.cpp" -I"$src/src/csrc/include" -I"$work/torchfort-build/include" \
  $mpiinc -L"$work/torchfort-build/lib" -ltorchfort $(mpicxx --showme:link) \
  -Wl,-rpath,"$work/torchfort-build/lib" -Wl,-rpath,"$torchlib" -o "$work/with_torchfort"
g++ -std=c++17 -O1 "$repo/tools/torchfort_compare.cpp" -I"$("$py" -m ftorch --includedir)" \
  -L"$("$py" -m ftorch --libdir)" -lftorch_c -Wl,-rpath,"$("$py" -m ftorch --libdir)" -o "$work/with_ftorch"

cd "$work"
status=0
while read -r name; do
  kind=float
  case "$name" in f8*) kind=double ;; esac
  ./with_torchfort "$name.yaml" "$kind" > "$name.torchfort.txt" 2>/dev/null
  ./with_ftorch "$name.yaml" "$kind" > "$name.ftorch.txt" 2>/dev/null
  "$py" - "$name" <<'PY' || status=1
import sys
name = sys.argv[1]
def values(path):  # (progress lines of report_frequency skipped)
    return [float(v) for v in open(path).read().split("\n") if v.strip() and not v.startswith("TORCHFORT::")]
a, b = values(f"{name}.torchfort.txt"), values(f"{name}.ftorch.txt")
assert len(a) == len(b) == 26, (len(a), len(b))
worst = max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b))
exact = sum(x == y for x, y in zip(a, b))
# TorchFort rounds a TORCHFORT_DOUBLE loss to float (this package keeps double): equal after rounding.
rounded = sum(x == float(__import__("numpy").float32(y)) for x, y in zip(a[:8], b[:8]))
print(f"{name:28s} {exact}/26 values identical (losses equal after rounding to float: {rounded}/8), "
      f"largest relative difference {worst:.2e}")
assert a[8:] == b[8:] and rounded == 8, "outputs must be identical and losses equal as TorchFort rounds them"
PY
done < configs.txt
exit $status
