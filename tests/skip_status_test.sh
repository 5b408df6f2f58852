#!/bin/sh
# skip_status.sh keeps a failure a failure: a failing test that printed "SKIP:" fails, a passing one is skipped (77).
here=$(dirname "$0")
check() {
  expected=$1
  shift
  "$here/skip_status.sh" "$@" >/dev/null
  got=$?
  if [ "$got" -ne "$expected" ]; then
    echo "FAILED: skip_status.sh $* exited $got, expected $expected"
    exit 1
  fi
}
check 1 sh -c 'echo "SKIP: no CUDA device"; exit 1'
check 2 sh -c 'echo "a check failed"; echo "SKIP: no CUDA device" >&2; exit 2'
check 77 sh -c 'echo "SKIP: no CUDA device"'
check 0 sh -c 'echo "all passed"'
check 3 sh -c 'exit 3'
echo "skip_status.sh: a failure stays failed, a passing SKIP: is skipped, the rest unchanged"
