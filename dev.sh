#!/usr/bin/env bash
# Set up (Debian packages, a virtualenv with portkern and the versions in constraints.txt) and go.
#   ./dev.sh demo [portkern demo options]   build, finalise, tune and run the examples on this CPU
#   ./dev.sh test [pytest options]          run the test suite
#   ./dev.sh setup                          only set up
#   ./dev.sh portkern ARGS...               any portkern command (paths relative to where you are)
#   ./dev.sh bench                          run every benchmark in bench/
#   ./dev.sh torch [pytest options]         install the torch extra and run the tests that need it (CI runs it)
#   ./dev.sh lint                           install the lint extra; ruff and mypy (pyproject.toml's [tool.ruff], [tool.mypy]; CI runs it)
#   ./dev.sh compat                         smoke test on every other supported Python and
#                                           with the lowest dependency versions (CI runs it)
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

# Whether this is a CI run (CI=true, as CI services and .ci/run set it): there, a Debian package
# that is missing fails setup, since the tests that need it would skip and the run pass without them.
under_ci() { case "${CI:-}" in 1 | true | TRUE | True | yes) return 0 ;; *) return 1 ;; esac; }

# The packages of APT_PACKAGES not installed here, one per line.
missing_packages() {
  local pkg
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
  done
}

apt_setup() {
  local missing=()
  mapfile -t missing < <(missing_packages)
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo=(sudo); else
      if under_ci; then
        log "CI: missing Debian packages (${missing[*]}) and no root (or sudo) to install them"
        return 1
      fi
      log "missing Debian packages (${missing[*]}); install them as root for the OpenCL/SPIR-V parts"
      return 0
    fi
  fi
  log "installing Debian packages: ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  mapfile -t missing < <(missing_packages)
  if [ ${#missing[@]} -gt 0 ]; then
    log "Debian packages still missing after apt-get install: ${missing[*]}"
    under_ci && return 1
  fi
  return 0
}

venv_setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating virtualenv $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  local stamp="$VENV/.portkern-installed"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ constraints.txt -nt "$stamp" ]; then
    log "installing portkern and the versions in constraints.txt into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[all]"
    touch "$stamp"
  fi
}

# The Python versions portkern supports (pyproject.toml's requires-python and classifiers).
PYTHONS=(3.10 3.11 3.12 3.13)
COMPAT_DIR="${PORTKERN_COMPAT_DIR:-.venvs}"

# An interpreter for Python X.Y: pyenv's, else pythonX.Y on PATH; nothing if neither.
find_python() {
  local root candidate
  if command -v pyenv >/dev/null; then
    root="$(pyenv root)"
    for candidate in "$root/versions/$1".*/bin/python "$root/versions/$1"/bin/python; do
      [ -x "$candidate" ] && { echo "$candidate"; return; }
    done
  fi
  command -v "python$1" || true
}

# smoke NAME PYTHON CONSTRAINTS: a fresh-enough virtualenv with `pip install .` (not
# editable: what users get) under CONSTRAINTS, then tests/test_smoke.py in it.
smoke() {
  local venv="$COMPAT_DIR/$1"
  log "smoke test: $1 ($("$2" --version 2>&1), $3)"
  if [ ! -x "$venv/bin/python" ] && ! "$2" -m venv "$venv"; then
    log "skipping $1: $2 cannot make a virtualenv (its venv module is missing)"
    rm -rf "$venv"
    return 0
  fi
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -c "$3" ".[test]"   # a local directory is always reinstalled
  "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_smoke.py
}

compat() {
  local main version python lowest=""
  main="$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  for version in "${PYTHONS[@]}"; do
    python="$(find_python "$version")"
    if [ -z "$python" ]; then
      log "skipping Python $version: no interpreter found (pyenv install $version, or put python$version on PATH)"
      continue
    fi
    [ -n "$lowest" ] || lowest="$python"
    if [ "$version" = "$main" ]; then
      log "Python $version: the whole suite runs there (./dev.sh test)"
    else
      smoke "py$version" "$python" constraints.txt
    fi
  done
  if [ -z "$lowest" ]; then
    log "skipping the lowest-versions run: no supported Python found"
  else
    smoke lowest "$lowest" constraints-lowest.txt
  fi
}

setup() { apt_setup; venv_setup; }

# build/lint/portkern: links to the source folders laid out as the import package (pyproject.toml's
# package-dir), which mypy reads (its mypy_path); remade each run, so added and removed files count.
lint_tree() {
  rm -rf build/lint
  "$VENV/bin/python" - <<'PY'
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

folders = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
for package, folder in sorted(folders.items()):  # a package before the packages inside it
    target = Path("build/lint", *package.split("."))
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(Path(folder).iterdir()):
        if entry.name != "__pycache__" and not (target / entry.name).exists():
            (target / entry.name).symlink_to(entry.resolve())
PY
}

lint() {
  "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[all,lint]"
  local failed=0
  "$VENV/bin/ruff" check . || failed=1
  lint_tree
  "$VENV/bin/mypy" || failed=1
  return "$failed"
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  demo)  setup; exec "$VENV/bin/portkern" demo "$@" ;;
  test)  setup; exec "$VENV/bin/python" -m pytest "$@" ;;
  setup) setup ;;
  portkern) setup; portkern="$(cd "$VENV/bin" && pwd)/portkern"; cd "$CALLER_DIR"; exec "$portkern" "$@" ;;
  compat) setup; compat ;;
  lint) setup; lint ;;
  torch) setup; "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[all,torch,corpus]"; exec "$VENV/bin/python" -m pytest tests/test_tensors.py tests/test_torch_programs.py tests/test_export_corpus.py "$@" ;;
  bench) setup; for b in bench/*.py; do log "$b"; "$VENV/bin/python" "$b"; done ;;
  *) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
