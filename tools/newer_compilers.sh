#!/usr/bin/env bash
# Today's distributions' Fortran compilers on a Debian 12 machine: gfortran 13 and 14 and LLVM flang 22
# from a Debian 13 (trixie) root made with debootstrap (Debian 13 ships no flang 20; 22 is its
# newest). Each compiler, and the programs it builds, run inside that root (chroot): the host's
# working directories are bind-mounted at the same paths, so a CMake build on the host calls a
# wrapper as its Fortran compiler and the test runs the program through `bin/in-root`.
#
# Usage: bash tools/newer_compilers.sh [DIR]     (DIR: $FTORCH_NEWER_COMPILERS or /opt/ftorch-newer)
# Leaves DIR/root (the Debian 13 root, ~2.1 GB) and DIR/bin: gfortran-13, gfortran-14, flang-new-22,
# in-root. Run as root; idempotent (the root is made once, the mounts are checked each time).
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
  grep -o " $root/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l
  rm -rf --one-file-system "$root"
  mkdir -p "$dir"
  debootstrap --variant=minbase --include="$packages" trixie "$root" http://deb.debian.org/debian \
    >"$dir/debootstrap.log" 2>&1 || { tail -20 "$dir/debootstrap.log"; exit 1; }
fi

# What a compiler or a program inside the root must see: /proc (flang finds its libraries through
# it), /dev, and the host directories that hold builds, sources and Python (the checkout, the
# virtual environment, pytest's temporary directories). Each is bound recursively (--rbind): a
# directory with other file systems mounted below it (a CI checkout on its own volume) shows them too.
# A checkout or environment under a system directory the root has its own copy of (/opt, /usr, /var)
# is bound at its own path instead of its top directory.
mounts=(/proc /dev /tmp /root /home /work)
system_dir() { case "$1" in /|/usr|/etc|/bin|/lib|/lib64|/sbin|/var|/opt|/boot|/sys|/srv|/run) return 0 ;; esac; return 1; }
visible() {  # the directory that makes $1 visible inside the root
  local p top; p="$(readlink -f "$1")"; top="${p#/}"; top="/${top%%/*}"
  if system_dir "$top"; then echo "$p"; else echo "$top"; fi
}
mounts+=("$(visible "$repo")")
venv="$(cd "$repo" && "${PYTHON:-$repo/.venv/bin/python}" -c 'import sys; print(sys.prefix)' 2>/dev/null || true)"
[ -n "$venv" ] && [ -f "$venv/pyvenv.cfg" ] && mounts+=("$(visible "$venv")")
for m in $(printf '%s\n' "${mounts[@]}" | sort -u); do
  [ -d "$m" ] || continue
  case "$m" in "$dir"|"$dir"/*) continue ;; esac   # never the root inside itself
  [ "$m" != /proc ] && system_dir "$m" && continue   # nor over the root's own system directories
  mkdir -p "$root$m"
  if ! mountpoint -q "$root$m"; then
    if [ "$m" = /proc ]; then mount -t proc proc "$root/proc"; else mount --rbind "$m" "$root$m"; fi
  fi
done
# Checked once here rather than met as a missing source file in the middle of a test run.
for must in "$repo/pyproject.toml" ${venv:+"$venv/pyvenv.cfg"}; do
  chroot "$root" test -e "$must" || { echo "newer_compilers.sh: $must is not visible inside $root" >&2; exit 1; }
done

mkdir -p "$dir/bin"
# in-root CMD ARGS...: CMD run inside the root, in the caller's directory, with the caller's environment.
cat >"$dir/bin/in-root" <<EOF
#!/bin/sh
exec chroot "$root" /bin/sh -c 'cd "\$0" && exec "\$@"' "\$PWD" "\$@"
EOF
for fc in "${compilers[@]}"; do
  printf '#!/bin/sh\nexec "%s/bin/in-root" /usr/bin/%s "$@"\n' "$dir" "$fc" >"$dir/bin/$fc"
done
chmod +x "$dir/bin/"*
for fc in "${compilers[@]}"; do
  echo "$fc: $("$dir/bin/$fc" --version | head -1)"
done
