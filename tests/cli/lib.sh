# Shared by the command-line tests (source it after `set -uo pipefail`): the binary
# under test, a scratch directory removed on exit, and failure counting.
#   expect_error CODE PATTERN -- command...   exit code CODE, stderr matching PATTERN
#                                             (and exactly one stderr line unless ONE_ERROR_LINE=0),
#                                             within ERROR_TIMEOUT seconds (default 60)
A=${ARCHIPELAGO:?set ARCHIPELAGO to the archipelago binary}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
passes=0
ONE_ERROR_LINE=${ONE_ERROR_LINE:-1}
ERROR_TIMEOUT=${ERROR_TIMEOUT:-60}

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { passes=$((passes + 1)); }

expect_error() {
  local code=$1 pattern=$2
  shift 3
  local err
  timeout "$ERROR_TIMEOUT" "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  err=$(cat "$work/err")
  if [[ $rc -ne $code ]]; then fail "$* exited $rc, expected $code (stderr: $err)"; return; fi
  if ! grep -qE "$pattern" "$work/err"; then fail "$*: stderr '$err' does not match '$pattern'"; return; fi
  if [[ $ONE_ERROR_LINE == 1 && $(wc -l <"$work/err") -ne 1 ]]; then fail "$*: expected one error line, got: $err"; return; fi
  pass
}
