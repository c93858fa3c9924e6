#!/usr/bin/env bash
# Formats the C++ sources with Debian 12's clang-format 14 and .clang-format (the only
# version that is checked: another one formats some constructs differently).
#
#   tools/format.sh          reformat every C++ file of the repository in place
#   tools/format.sh --check  change nothing: name each file out of format, print how many
#                            there are, exit 1 if any (the suite's tidy/format test)
#   tools/format.sh --changed [BASE]
#                            change nothing: print the reformatting of the lines changed since
#                            BASE (default main; uncommitted changes included), exit 1 if any
#                            (before a commit or a merge; git clang-format-14)
#
# Every tracked *.cpp, *.hpp and *.h is formatted; none is skipped. Environment:
# CLANG_FORMAT (default clang-format-14).
set -euo pipefail

cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format-14}
MODE=${1:-fix}
if [[ $MODE != fix && $MODE != --check && $MODE != --changed ]] || { [[ $MODE != --changed ]] && (($# > 1)); }; then
  echo "format: unknown arguments '$*' (none to reformat, --check to check, --changed [BASE])" >&2
  exit 2
fi
if ! command -v "$CLANG_FORMAT" >/dev/null; then
  echo "format: $CLANG_FORMAT not found (apt-get install clang-format-14; tools/setup.sh test installs it)" >&2
  exit 2
fi
if ! "$CLANG_FORMAT" --version | grep -q 'version 14\.'; then
  echo "format: $CLANG_FORMAT is not clang-format 14: $("$CLANG_FORMAT" --version)" >&2
  exit 2
fi

if [[ $MODE == --changed ]]; then
  base=${2:-main}
  if ! git rev-parse --verify --quiet "$base^{commit}" >/dev/null; then
    echo "format: '$base' is no commit of this repository" >&2
    exit 2
  fi
  # git clang-format compares the working tree with the merge base's files, line by line.
  changes=$(git clang-format-14 --binary "$(command -v "$CLANG_FORMAT")" --style file --extensions cpp,hpp,h \
            --diff "$(git merge-base "$base" HEAD)" --)
  if [[ -z $changes || $changes == "no modified files to format" ||
        $changes == "clang-format did not modify any files" ]]; then
    echo "format: every line changed since $base is formatted"
    exit 0
  fi
  printf '%s\n' "$changes"
  echo "format: lines changed since $base are out of format (the diff above; git clang-format-14 $base applies it)"
  exit 1
fi

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h')
else  # a source tarball
  mapfile -t files < <(find actors storage tools tests deploy -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' \) | sort)
fi
if ((${#files[@]} == 0)); then
  echo "format: no C++ file found" >&2
  exit 2
fi

if [[ $MODE == fix ]]; then
  "$CLANG_FORMAT" -i --style=file "${files[@]}"
  echo "format: ${#files[@]} files formatted with $("$CLANG_FORMAT" --version | head -1)"
  exit 0
fi

# --dry-run names every line that would change; one file per distinct name.
mapfile -t bad < <("$CLANG_FORMAT" --dry-run --style=file "${files[@]}" 2>&1 |
                   sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: warning: code should be clang-formatted.*/\1/p' | sort -u)
for f in "${bad[@]}"; do echo "out of format: $f"; done
if ((${#bad[@]} > 0)); then
  echo "format: ${#bad[@]} of ${#files[@]} files are out of format (tools/format.sh reformats them)"
  exit 1
fi
echo "format: all ${#files[@]} files are formatted"
