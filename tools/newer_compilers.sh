#!/usr/bin/env bash
# Today's distributions' Fortran compilers on a Debian 12 machine: gfortran 13 and 14 and LLVM flang 22
# from a Debian 13 (trixie) root made with debootstrap (Debian 13 ships no flang 20; 22 is its
# newest). Each compiler, and each program it builds, runs with that root's /usr in a private mount
# namespace (bin/in-root, below): a CMake build on the host calls a wrapper as its Fortran compiler,
# and the test runs the program through `bin/in-root`.
#
# Usage: bash tools/newer_compilers.sh [DIR]     (DIR: $FTORCH_NEWER_COMPILERS or /opt/ftorch-newer)
# Leaves DIR/root (the Debian 13 root, ~2.1 GB) and DIR/bin: gfortran-13, gfortran-14, flang-new-22,
# in-root. Run as root; idempotent (the root is made once; each run checks that every compiler
# builds and runs a program in the checkout).
# tests/conftest.py finds DIR/bin through $FTORCH_NEWER_COMPILERS (default /opt/ftorch-newer).
set -euo pipefail
dir="${1:-${FTORCH_NEWER_COMPILERS:-/opt/ftorch-newer}}"
root="$dir/root"
repo="$(cd "$(dirname "$0")/.." && pwd)"
compilers=(gfortran-13 gfortran-14 flang-new-22)  # the wrappers (conftest NEWER_COMPILERS)
packages=gfortran-13,gfortran-14,flang-22

if [ ! -x "$root/usr/bin/gfortran-14" ] || [ ! -e "$root/usr/bin/flang-new-22" ]; then
  command -v debootstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  echo "==> Debian 13 root with $packages in $root"
  # Never follow a bind mount of a host directory while removing an incomplete root.
  { grep -o " $root/[^ ]*" /proc/mounts || true; } | sort -r | xargs -r -n1 umount -l
  rm -rf --one-file-system "$root"
  mkdir -p "$dir"
  debootstrap --variant=minbase --include="$packages" trixie "$root" http://deb.debian.org/debian \
    >"$dir/debootstrap.log" 2>&1 || { tail -20 "$dir/debootstrap.log"; exit 1; }
fi

# A compiler from the root, and each program it builds, runs in a private mount namespace of its own
# (unshare) in which the root's /usr is mounted over the host's /usr (Debian 12 and 13 both keep
# /bin, /lib and /lib64 as links into /usr) and the root's ld.so.cache over the host's. It sees the
# newer C library, compilers and runtime libraries, and every host directory as it is: the checkout,
# the virtual environment and pytest's temporary directories, wherever they live and whatever is
# mounted there. (A chroot had to bind each host directory into the root, and a CI checkout on a
# volume that a bind mount did not carry stayed invisible inside it.) Nothing is mounted on the host.
# Bind mounts that an earlier version of this script left inside the root are released.
{ grep -o " $root/[^ ]*" /proc/mounts || true; } | sort -r | xargs -r -n1 umount -l
command -v unshare >/dev/null || { echo "newer_compilers.sh: unshare (util-linux) is missing" >&2; exit 1; }

mkdir -p "$dir/bin"
# in-root CMD ARGS...: CMD run with the root's /usr, in the caller's directory and environment.
cat >"$dir/bin/in-root" <<EOF
#!/bin/sh
exec unshare --mount --propagation private /bin/sh -c \\
  'mount --bind "\$0/usr" /usr && mount --bind "\$0/etc/ld.so.cache" /etc/ld.so.cache && exec "\$@"' \\
  "$root" "\$@"
EOF
for fc in "${compilers[@]}"; do
  printf '#!/bin/sh\nexec "%s/bin/in-root" /usr/bin/%s "$@"\n' "$dir" "$fc" >"$dir/bin/$fc"
done
chmod +x "$dir/bin/"*
# Each compiler builds and runs a program in the checkout's build directory before any test does.
smoke="$repo/build/newer-compilers-smoke"
mkdir -p "$smoke"
printf 'program smoke\n  use iso_fortran_env, only: compiler_version\n  print "(a)", compiler_version()\nend program\n' >"$smoke/smoke.f90"
for fc in "${compilers[@]}"; do
  (cd "$smoke" && "$dir/bin/$fc" smoke.f90 -o "smoke-$fc" && "$dir/bin/in-root" "./smoke-$fc") >"$smoke/$fc.log" 2>&1 ||
    { cat "$smoke/$fc.log" >&2; echo "newer_compilers.sh: $fc cannot build and run a program in $smoke" >&2; exit 1; }
  echo "$fc: $(head -1 "$smoke/$fc.log")"
done
