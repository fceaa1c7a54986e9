#!/usr/bin/env bash
# Type checks of the fedwan Python packages, run against the packages that
# PYTHON imports: an installed one, or a build tree's (PACKAGE_PARENT, the
# directory holding fedwan/, e.g. build/python, goes first on PYTHONPATH).
#
#   1. mypy over the packages: the inline annotations of their modules and
#      the extension's stubs (fedwan/_fedwan.pyi), with pyproject.toml's
#      [tool.mypy] (fedwan, then fedwan_results);
#   2. mypy --strict over bindings/python/tests/typing_usage.py, the API as a
#      typed program uses it; its `type: ignore` lines are misuses the stubs
#      must reject (an ignore that silences nothing fails the check);
#   3. mypy.stubtest: the stubs against the compiled module itself (every
#      name on both sides, properties as properties, static methods as such).
#
#   scripts/typecheck.sh PYTHON [PACKAGE_PARENT]
#   e.g. scripts/typecheck.sh /tmp/venv/bin/python build/python
#
# PYTHON needs mypy and numpy (a venv with --system-site-packages and
# `pip install mypy` does for Debian's python3). All three checks run; the
# exit status is non-zero when any failed. Cache: $FEDWAN_MYPY_CACHE, else
# ~/.cache/fedwan/mypy-<hash of PYTHON>.
set -uo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 PYTHON [PACKAGE_PARENT]" >&2
  exit 2
fi
PY=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -eq 2 ]; then
  parent=$(cd "$2" && pwd) || { echo "typecheck: no directory $2" >&2; exit 2; }
  export PYTHONPATH="$parent${PYTHONPATH:+:$PYTHONPATH}"
fi
say() { echo "typecheck: $*"; }

if ! "$PY" -c "import mypy, numpy" 2>/dev/null; then
  echo "typecheck: $PY cannot import mypy and numpy (pip install mypy)" >&2
  exit 2
fi
# Which fedwan is checked, and that it ships its stubs and PEP 561 marker
# (without them mypy would only say the module has no type information).
pkg=$("$PY" -c "import os, fedwan; print(os.path.dirname(fedwan.__file__))") || {
  echo "typecheck: $PY cannot import fedwan (build it, or pass PACKAGE_PARENT)" >&2
  exit 2
}
for f in py.typed _fedwan.pyi; do
  if [ ! -f "$pkg/$f" ]; then
    echo "typecheck: $pkg has no $f (re-run cmake on the build tree, or reinstall)" >&2
    exit 1
  fi
done
say "fedwan from $pkg, $("$PY" -m mypy --version)"

key=$(printf '%s' "$("$PY" -c 'import sys; print(sys.executable)')" | sha256sum | cut -c1-12)
CACHE=${FEDWAN_MYPY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fedwan/mypy-$key}
CONFIG=$ROOT/pyproject.toml
failed=()

say "mypy -p fedwan"
"$PY" -m mypy --config-file "$CONFIG" --cache-dir "$CACHE" -p fedwan || failed+=("mypy -p fedwan")

say "mypy -p fedwan_results"
"$PY" -m mypy --config-file "$CONFIG" --cache-dir "$CACHE" -p fedwan_results ||
  failed+=("mypy -p fedwan_results")

say "mypy --strict typing_usage.py"
"$PY" -m mypy --config-file "$CONFIG" --cache-dir "$CACHE" --strict \
  "$ROOT/bindings/python/tests/typing_usage.py" || failed+=("mypy --strict typing_usage.py")

say "stubtest fedwan._fedwan"
"$PY" -m mypy.stubtest --mypy-config-file "$CONFIG" \
  --allowlist "$ROOT/bindings/python/tests/stubtest_allowlist.txt" fedwan._fedwan ||
  failed+=("stubtest fedwan._fedwan")

if [ ${#failed[@]} -gt 0 ]; then
  echo "typecheck: FAILED: ${failed[*]}" >&2
  exit 1
fi
say "passed"
