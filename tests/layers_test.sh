#!/bin/sh
# tests/layers.cmake finds what it is there to find: given a tree with an upward include, a Lua call in runtime/, a
# getenv in app/ and one of a RUNNER_* variable in runtime/, it fails naming each; given a folder without sources, it
# fails instead of passing.
set -u
here=$(cd "$(dirname "$0")" && pwd)
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/runtime/core" "$tree/runtime/serve" "$tree/app" "$tree/bindings" "$tree/stdlib"
printf '#include "runtime/serve/page.h"\n' >"$tree/runtime/core/clock.h"
printf '// a page\n' >"$tree/runtime/serve/page.h"
printf 'void f(lua_State* L);\n' >"$tree/runtime/serve/view.cpp"
printf 'const char* home = getenv("HOME");\n' >"$tree/app/main.cpp"
printf 'const char* wait = std::getenv("RUNNER_WAIT");\n' >"$tree/runtime/serve/limits.cpp"
fail() {
  echo "FAILED: $1"
  echo "$output"
  exit 1
}
# CMake wraps its error text: compared with the whitespace joined.
output=$(cmake -DRUNNER_SOURCE_DIR="$tree" -P "$here/layers.cmake" 2>&1) && fail "a tree that breaks every rule passed"
joined=$(echo "$output" | tr -s ' \n' '  ')
for expected in "includes point down: runtime/core/clock.h includes serve/ (core/ may use ):" \
  "only bindings/ touches the Lua C API: runtime/serve/view.cpp: void f(lua_State* L)" \
  "process facts go through core::LaunchContext: app/main.cpp: const char* home = getenv(\"HOME\")" \
  "process facts go through core::LaunchContext: runtime/serve/limits.cpp: const char* wait = std::getenv(\"RUNNER_WAIT\")"; do
  echo "$joined" | grep -qF "$expected" || fail "not named: $expected"
done
output=$(cmake -DRUNNER_SOURCE_DIR="$tree/stdlib" -P "$here/layers.cmake" 2>&1) && fail "a root without sources passed"
echo "$output" | tr -s ' \n' '  ' | grep -qF "no sources under $tree/stdlib/runtime" ||
  fail "a root without sources is not named"
echo "layers.cmake names an upward include, a Lua call in runtime/, a getenv in app/ and of RUNNER_* in runtime/, and a root without sources"
