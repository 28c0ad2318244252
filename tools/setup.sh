#!/usr/bin/env bash
# One-time (and re-runnable) setup on Debian 12, as root: LLVM 22 toolchain (with its
# headers, for the inlining plugin), deb-src for `apt-get source`, build tools, and the
# project's virtualenv in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(clang-22 llvm-22 llvm-22-dev lld-22 bear dpkg-dev g++
  # SHA-256 for the native mlgo-cc's memory of the size guard
  nettle-dev
  # the build systems that the `mlgo corpus record` tests drive
  cmake ninja-build meson autoconf automake libtool
  # instruction and block counts of a program's workload
  valgrind)
# LLVM's corpus tools. Its top-level package is also named `mlgo`, so it lives beside the
# venv's site-packages and mlgo runs it in a separate interpreter.
MLGO_UTILS="mlgo-utils==19.0.0.dev202407180600"
SOURCES=/etc/apt/sources.list.d/debian.sources

die() { echo "setup: $*" >&2; exit 1; }
missing_packages() {
  local p
  for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done
}

need_update=0
if [ -f "$SOURCES" ] && grep -q '^Types: deb$' "$SOURCES"; then
  [ "$(id -u)" = 0 ] || die "deb-src must be enabled in $SOURCES; run as root"
  sed -i 's/^Types: deb$/Types: deb deb-src/' "$SOURCES"
  need_update=1
fi
missing=$(missing_packages)
if [ -n "$missing" ]; then
  [ "$(id -u)" = 0 ] || die "need Debian packages: $missing; run this script as root"
  need_update=1
fi
if [ "$need_update" = 1 ]; then
  apt-get update -q >/tmp/mlgo-apt-update.log 2>&1 \
    || die "apt-get update failed (offline? see /tmp/mlgo-apt-update.log)"
fi
if [ -n "$missing" ]; then
  echo "setup: installing $missing"
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/tmp/mlgo-apt.log 2>&1 \
    || die "apt-get install failed (offline? see /tmp/mlgo-apt.log)"
fi

PY=${PYTHON:-python3}
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null \
  || die "$PY must be Python 3.11 (set PYTHON=...)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv || die "cannot create .venv"
if ! TF_USE_LEGACY_KERAS=1 .venv/bin/python -c 'import mlgo.cli, tensorflow, tf_agents, jax, llvmlite, ray' 2>/dev/null \
   || [ pyproject.toml -nt .venv/.mlgo-installed ] || [ tools/requirements.lock -nt .venv/.mlgo-installed ]; then
  echo "setup: installing Python packages into .venv (first time: a few minutes)"
  .venv/bin/pip install -qq --upgrade pip >/dev/null || die "pip upgrade failed (offline?)"
  .venv/bin/pip install -qq -c tools/requirements.lock -e ".[dev,ray]" \
    || die "pip install failed (offline?)"
  touch .venv/.mlgo-installed
fi
if [ ! -d .venv/mlgo-utils/mlgo/corpus ]; then
  .venv/bin/pip install -qq --no-deps --target .venv/mlgo-utils "$MLGO_UTILS" \
    || die "cannot install $MLGO_UTILS (offline?)"
fi
# mlgo's own modules as bytecode: an editable install leaves them as source, which each mlgo
# process (the CLI, mlgo-cc, the service, every worker) would compile again where
# PYTHONDONTWRITEBYTECODE is set; a module edited since is compiled in memory as usual.
.venv/bin/python -m compileall -q -j 0 mlgo tools >/dev/null || die "cannot compile mlgo's modules"
# mlgo-cc/mlgo-c++ in C over pip's Python entry points (pip reinstalls put those back).
.venv/bin/mlgo install-wrappers >/dev/null || die "cannot build the native mlgo-cc (is cc installed?)"
.venv/bin/mlgo doctor >/dev/null || die "toolchain check failed: run .venv/bin/mlgo doctor"
echo "setup: ready (.venv/bin/mlgo)"
