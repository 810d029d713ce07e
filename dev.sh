#!/usr/bin/env bash
# Set up (Debian packages, a virtualenv with portkern and its pinned deps) and go.
#   ./dev.sh demo [portkern demo options]   build, finalise, tune and run the examples on this CPU
#   ./dev.sh test [pytest options]          run the test suite
#   ./dev.sh setup                          only set up
#   ./dev.sh portkern ARGS...               any portkern command (paths relative to where you are)
#   ./dev.sh bench                          run every benchmark in bench/
set -euo pipefail
CALLER_DIR="$PWD"
cd "$(dirname "$0")"

VENV="${PORTKERN_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
# OpenCL C -> SPIR-V on the build host, PoCL to finalise SPIR-V on this CPU, and a real
# (old) HIP runtime so the AMD probe is tested against one even without a GPU, and a
# Redis server that the remote-cache tests start on a loopback port.
APT_PACKAGES=(clang-15 llvm-spirv-15 spirv-tools pocl-opencl-icd ocl-icd-libopencl1 libamdhip64-5 redis-server)

log() { printf 'dev.sh: %s\n' "$*" >&2; }

apt_setup() {
  local missing=()
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo=(sudo); else
      log "missing Debian packages (${missing[*]}); install them as root for the OpenCL/SPIR-V parts"
      return 0
    fi
  fi
  log "installing Debian packages: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

venv_setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating virtualenv $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  local stamp="$VENV/.portkern-installed"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    log "installing portkern and its pinned dependencies into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -e ".[all]"
    touch "$stamp"
  fi
}

setup() { apt_setup; venv_setup; }

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  demo)  setup; exec "$VENV/bin/portkern" demo "$@" ;;
  test)  setup; exec "$VENV/bin/python" -m pytest "$@" ;;
  setup) setup ;;
  portkern) setup; portkern="$(cd "$VENV/bin" && pwd)/portkern"; cd "$CALLER_DIR"; exec "$portkern" "$@" ;;
  bench) setup; for b in bench/*.py; do log "$b"; "$VENV/bin/python" "$b"; done ;;
  *) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
