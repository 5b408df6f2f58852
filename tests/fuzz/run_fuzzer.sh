#!/usr/bin/env bash
# ctest's "fuzz: libFuzzer <target>": fuzzes one target for a bounded time and writes only under WORK (the build
# folder's fuzz/), never into the checkout:
#   run_fuzzer.sh TARGET BINARY SECONDS WORK FUZZ_SOURCE_DIR
# The inputs come from FUZZ_SOURCE_DIR/corpus/TARGET and FUZZ_SOURCE_DIR/regressions/TARGET, read only, and from the
# scratch corpus WORK/corpus/TARGET, the first corpus libFuzzer is given and so the one where it adds the new inputs
# it finds (kept from run to run). An input that crashes, leaks, runs out of memory or times out goes to
# WORK/findings/TARGET/ with the log, and the test fails naming it. (scripts/fuzz, run by hand, copies such an input
# into tests/fuzz/regressions/TARGET/, which "fuzz: replay TARGET" replays from then on.)
set -euo pipefail
(($# == 5)) || { echo "usage: run_fuzzer.sh TARGET BINARY SECONDS WORK FUZZ_SOURCE_DIR" >&2; exit 2; }
target="$1" binary="$2" seconds="$3" work="$4" sources="$5"
[ -x "$binary" ] || { echo "fuzz: $binary is not built (\"fuzz: libFuzzer build\" builds it)" >&2; exit 2; }
scratch="$work/corpus/$target"
findings="$work/findings/$target"
mkdir -p "$scratch" "$findings"
rm -f "$findings"/{crash,leak,timeout,oom,slow-unit}-* "$findings/log"
corpora=("$scratch")
for dir in "$sources/corpus/$target" "$sources/regressions/$target"; do
  [ -d "$dir" ] && corpora+=("$dir")
done
echo "fuzz: $target for ${seconds}s (log: $findings/log)"
status=0
# Run from the findings folder: libFuzzer writes nothing outside it and the scratch corpus. One input may take 10 s,
# and the process 2 GiB (LibTorch alone maps a few hundred MiB).
(cd "$findings" && OMP_NUM_THREADS=1 "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$findings/" "${corpora[@]}" >"$findings/log" 2>&1) || status=$?
{ grep -E '^#[0-9]+' "$findings/log" | tail -1; grep -E '^Done [0-9]+ runs' "$findings/log"; } | sed 's/^/  /' || true
found=($(shopt -s nullglob; echo "$findings"/{crash,leak,timeout,oom}-*))
if ((status == 0 && ${#found[@]} == 0)); then
  echo "fuzz: no findings in $target"
  exit 0
fi
tail -n 40 "$findings/log"
for input in "${found[@]}"; do
  echo "fuzz: $target: FOUND $input (to replay it in every build from now on: mkdir -p" \
       "'$sources/regressions/$target' && cp '$input' '$sources/regressions/$target/')"
done
((${#found[@]})) || echo "fuzz: $target: libFuzzer exited with status $status and left no input (log: $findings/log)"
exit 1
