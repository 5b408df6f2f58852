#!/bin/sh
# tests/layers.cmake finds what it is there to find: given a tree with an upward include, a Lua call in runtime/, a
# getenv in app/, one of a RUNNER_* variable in runtime/ and diffusion files including the other family's, it fails
# naming each; given a folder without sources, it
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
mkdir -p "$tree/runtime/diffusion"
printf '#include "runtime/diffusion/gaussian_diffusion.h"\n' >"$tree/runtime/diffusion/flow_sampler.h"
printf '#include "runtime/diffusion/flow.h"\n' >"$tree/runtime/diffusion/sampling.h"
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
  "process facts go through core::LaunchContext: runtime/serve/limits.cpp: const char* wait = std::getenv(\"RUNNER_WAIT\")" \
  "the diffusion families stand side by side: runtime/diffusion/flow_sampler.h (flow) includes gaussian's gaussian_diffusion.h" \
  "the diffusion families stand side by side: runtime/diffusion/sampling.h (shared) includes flow's flow.h"; do
  echo "$joined" | grep -qF "$expected" || fail "not named: $expected"
done
output=$(cmake -DRUNNER_SOURCE_DIR="$tree/stdlib" -P "$here/layers.cmake" 2>&1) && fail "a root without sources passed"
echo "$output" | tr -s ' \n' '  ' | grep -qF "no sources under $tree/stdlib/runtime" ||
  fail "a root without sources is not named"
echo "layers.cmake names an upward include, a Lua call in runtime/, a getenv in app/ and of RUNNER_* in runtime/, a diffusion family including the other's, and a root without sources"
