#!/usr/bin/env bash
# Prepares, on a Debian 12 machine with network, what tools/gpu_check.sh needs on a GPU machine
# that has a CUDA build of torch but no Fortran compiler and no network:
#   DIR/gfortran.tar.xz  Debian's gfortran 12 in one relocatable prefix, with OpenACC (libgomp) and
#                        the nvptx offload compiler (gcc-12-offload-nvptx, nvptx-tools, libgomp's
#                        nvptx plugin), ~45 MB
#   DIR/whl/             the fypp wheel
#   DIR/yaml/            libyaml's header and static library (Debian's libyaml-dev), for the
#                        TorchFort API's configuration files (gpu_check.sh builds with it)
# Usage: bash tools/gpu_bundle.sh DIR
# On the GPU machine: bash tools/gpu_check.sh DIR/gfortran.tar.xz DIR/whl
# The drivers find their programs and libraries relative to themselves; the target's binutils and
# C library are used (checked on Ubuntu 24.04, glibc 2.39).
set -euo pipefail
out="$(mkdir -p "$1" && cd "$1" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download gfortran-12 gcc-12 cpp-12 libgfortran-12-dev libgfortran5 libgcc-12-dev gcc-12-base \
  libquadmath0 libisl23 libmpc3 libmpfr6 libgomp1 gcc-12-offload-nvptx nvptx-tools libgomp-plugin-nvptx1 >/dev/null)
mkdir "$tmp/root"
for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$tmp/root"; done
gcc="$tmp/root/usr/lib/gcc/x86_64-linux-gnu/12"
# Not needed to build and run Fortran: documentation, sanitizers, thread-analysis runtimes.
rm -rf "$tmp/root/usr/share" "$tmp"/root/usr/bin/*lto-dump* "$tmp"/root/usr/bin/*gcov* "$gcc/plugin" \
  "$gcc"/lib{asan,tsan,lsan,ubsan,hwasan,itm}*
ln -sf x86_64-linux-gnu-gfortran-12 "$tmp/root/usr/bin/gfortran"
tar cJf "$out/gfortran.tar.xz" -C "$tmp/root" .
python3 -m pip download -q --no-deps -d "$out/whl" fypp
(cd "$tmp" && apt-get download libyaml-dev >/dev/null)
rm -rf "$out/yaml" && dpkg -x "$tmp"/libyaml-dev_*.deb "$out/yaml"
ls -la "$out/gfortran.tar.xz" "$out/whl" "$out/yaml/usr/include/yaml.h"
