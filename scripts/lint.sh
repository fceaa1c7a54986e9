#!/usr/bin/env bash
# Lints the tree with Debian 12's clang-format and clang-tidy (14):
#   scripts/lint.sh [--fix] [BUILD_DIR]
#
# clang-format (.clang-format): every C++ file git knows of (tracked, plus
#   untracked ones that are not ignored); checked, or rewritten in place
#   with --fix.
# clang-tidy (.clang-tidy): the library's sources (src/, less the LibTorch
#   layer src/torch/, the CLI src/cli/ and the torch workload
#   src/workload/fashion_*) that changed since a base, with the library
#   sources that include a changed header directly; findings in the headers
#   under src/ and include/fedwan/ they include count too. --fix applies
#   no clang-tidy fix: those want a person.
#   The base: $FEDWAN_LINT_BASE (a git revision, or "all" for every library
#   source), else `git merge-base HEAD origin/main`; on main itself (or
#   without origin/main) the parent commit, so the newest commit's change
#   is checked; in a repository of one commit, every library source.
#   Needs BUILD_DIR/compile_commands.json (BUILD_DIR: the argument, else
#   $FEDWAN_BUILD_DIR, else build), which any configure of the project
#   writes (CMAKE_EXPORT_COMPILE_COMMANDS is on in CMakeLists.txt).
#
# Exits 0 when both are clean, 1 on findings, 2 on a usage or setup error;
# the last line is a one-line summary. $FEDWAN_JOBS: clang-tidy processes
# (default: nproc). $CLANG_FORMAT / $CLANG_TIDY: the binaries.
set -euo pipefail
cd "$(dirname "$0")/.."

fix=0
build_dir="${FEDWAN_BUILD_DIR:-build}"
for arg in "$@"; do
  case "$arg" in
    --fix) fix=1 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "lint: unknown option '$arg'; usage: scripts/lint.sh [--fix] [BUILD_DIR]" >&2; exit 2 ;;
    *) build_dir="$arg" ;;
  esac
done
jobs="${FEDWAN_JOBS:-$(nproc)}"

pick() {  # the versioned binary Debian installs, else the plain name
  if command -v "$1-14" >/dev/null 2>&1; then echo "$1-14"; else echo "$1"; fi
}
CLANG_FORMAT="${CLANG_FORMAT:-$(pick clang-format)}"
CLANG_TIDY="${CLANG_TIDY:-$(pick clang-tidy)}"
for tool in "$CLANG_FORMAT" "$CLANG_TIDY"; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "lint: '$tool' not found; install Debian's clang-format and clang-tidy (scripts/setup.sh)" >&2
    exit 2
  fi
done
# Another major version formats some constructs differently than the one
# the tree was formatted with.
fmt_major="$("$CLANG_FORMAT" --version | sed -n 's/.*version \([0-9]*\).*/\1/p')"
if [ "$fmt_major" != 14 ]; then
  echo "lint: warning: $CLANG_FORMAT is version $fmt_major; the tree is formatted with 14" >&2
fi

# Files git knows of and that exist (a deleted one is still listed until
# its deletion is committed).
git_files() {
  git ls-files --cached --others --exclude-standard -- "$@" | sort -u |
    while IFS= read -r f; do [ -f "$f" ] && printf '%s\n' "$f"; done
}

# ---- clang-format ----------------------------------------------------------
mapfile -t cxx_files < <(git_files '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh')
fmt_bad=()
if [ "$fix" = 1 ]; then
  printf '%s\0' "${cxx_files[@]}" | xargs -0 -r "$CLANG_FORMAT" -i --style=file
  fmt_summary="clang-format: ${#cxx_files[@]} files formatted in place"
else
  # --dry-run goes through every file and reports each line to change.
  mapfile -t fmt_bad < <(
    printf '%s\0' "${cxx_files[@]}" |
      xargs -0 -r "$CLANG_FORMAT" --dry-run -Werror --style=file 2>&1 |
      sed -n 's/^\(.*\):[0-9]*:[0-9]*: \(warning\|error\): code should be clang-formatted.*/\1/p' |
      sort -u)
  if [ ${#fmt_bad[@]} -gt 0 ]; then
    echo "lint: clang-format: ${#fmt_bad[@]} files are not formatted:"
    printf '  %s\n' "${fmt_bad[@]}"
    echo "  see the changes: $CLANG_FORMAT --style=file FILE | diff FILE -"
    echo "  apply them:      scripts/lint.sh --fix"
    fmt_summary="clang-format: ${#fmt_bad[@]} of ${#cxx_files[@]} files unformatted"
  else
    fmt_summary="clang-format: ${#cxx_files[@]} files clean"
  fi
fi

# ---- clang-tidy ------------------------------------------------------------
db="$build_dir/compile_commands.json"
if [ ! -f "$db" ]; then
  echo "lint: $db not found: clang-tidy needs the compile commands of a configured build." >&2
  echo "  configure one:  cmake -S . -B $build_dir -DCMAKE_EXPORT_COMPILE_COMMANDS=ON" >&2
  echo "  (or name another build directory: scripts/lint.sh BUILD_DIR, or FEDWAN_BUILD_DIR)" >&2
  echo "lint: FAILED: $fmt_summary; clang-tidy: not run (no $db)"
  exit 2
fi

is_library_source() {
  case "$1" in
    src/torch/*|src/cli/*|src/workload/fashion_*) return 1 ;;
    src/*.cpp) return 0 ;;
    *) return 1 ;;
  esac
}
mapfile -t lib_all < <(git_files 'src/*.cpp' | while IFS= read -r f; do
  if is_library_source "$f"; then printf '%s\n' "$f"; fi; done)

base="${FEDWAN_LINT_BASE:-}"
if [ -z "$base" ]; then
  base="$(git merge-base HEAD origin/main 2>/dev/null || true)"
  # On main itself (a clean clone, CI): what the newest commit changed.
  if [ -z "$base" ] || [ "$base" = "$(git rev-parse HEAD)" ]; then
    base="$(git rev-parse -q --verify 'HEAD~1^{commit}' 2>/dev/null || echo all)"
  fi
fi
if [ "$base" = all ]; then
  base_label="all library sources"
  tidy_files=("${lib_all[@]}")
else
  if ! git rev-parse --verify -q "$base^{commit}" >/dev/null; then
    echo "lint: FEDWAN_LINT_BASE='$base' is not a git revision (or use 'all')" >&2
    exit 2
  fi
  base_label="changed since $(git rev-parse --short "$base")"
  # Changed against the base: committed since, staged, unstaged, untracked.
  mapfile -t changed < <({ git diff --name-only --diff-filter=ACMR "$base" --;
                           git ls-files --others --exclude-standard; } | sort -u)
  declare -A pick_set=()
  for f in "${changed[@]}"; do
    if is_library_source "$f" && [ -f "$f" ]; then pick_set["$f"]=1; fi
    # A changed header: the library sources that include it by the path
    # the tree includes it by ("wire/frame.hpp", "fedwan/error.hpp").
    case "$f" in
      src/*.hpp|src/*.h) inc="${f#src/}" ;;
      include/*.hpp|include/*.h) inc="${f#include/}" ;;
      *) continue ;;
    esac
    for s in "${lib_all[@]}"; do
      if grep -qF "#include \"$inc\"" "$s"; then pick_set["$s"]=1; fi
    done
  done
  mapfile -t tidy_files < <(printf '%s\n' "${!pick_set[@]}" | sed '/^$/d' | sort)
fi

# A source the build has not seen yet (added since the last configure) has
# no compile command: clang-tidy would guess flags and report nonsense.
unknown=()
if [ ${#tidy_files[@]} -gt 0 ]; then
  in_db=()
  for f in "${tidy_files[@]}"; do
    if grep -qF "\"file\": \"$PWD/$f\"" "$db"; then in_db+=("$f"); else unknown+=("$f"); fi
  done
  tidy_files=("${in_db[@]+"${in_db[@]}"}")
fi
if [ ${#unknown[@]} -gt 0 ]; then
  echo "lint: ${#unknown[@]} library sources have no entry in $db; re-run cmake on $build_dir:"
  printf '  %s\n' "${unknown[@]}"
fi

tidy_findings=0
tidy_out="$(mktemp)"
trap 'rm -f "$tidy_out"' EXIT
if [ ${#tidy_files[@]} -gt 0 ]; then
  echo "lint: clang-tidy over ${#tidy_files[@]} library sources ($base_label), $jobs at a time..."
  start=$SECONDS
  # Each finding once: a header's is reported by every source including it.
  printf '%s\0' "${tidy_files[@]}" |
    xargs -0 -r -n 1 -P "$jobs" "$CLANG_TIDY" -p "$build_dir" --quiet >"$tidy_out" 2>&1 || true
  mapfile -t findings < <(grep -E '^[^ ].*:[0-9]+:[0-9]+: (warning|error): ' "$tidy_out" |
                            sed "s|^$PWD/||" | sort -u)
  tidy_findings=${#findings[@]}
  if [ "$tidy_findings" -gt 0 ]; then
    echo "lint: clang-tidy: $tidy_findings findings (checks and reasons in .clang-tidy):"
    printf '  %s\n' "${findings[@]}"
    echo "  details: $CLANG_TIDY -p $build_dir FILE"
  fi
  tidy_summary="clang-tidy: $tidy_findings findings in ${#tidy_files[@]} library sources ($base_label, $((SECONDS - start)) s)"
else
  tidy_summary="clang-tidy: no library source to check ($base_label)"
fi

if [ ${#unknown[@]} -gt 0 ]; then
  tidy_summary="$tidy_summary; ${#unknown[@]} sources not in $db"
fi
if [ ${#fmt_bad[@]} -gt 0 ] || [ "$tidy_findings" -gt 0 ] || [ ${#unknown[@]} -gt 0 ]; then
  echo "lint: FAILED: $fmt_summary; $tidy_summary"
  exit 1
fi
echo "lint: OK: $fmt_summary; $tidy_summary"
