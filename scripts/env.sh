# Sourced by scripts/*: where the shared cache (venv with torch) and the build live.
RUNNER_CACHE="${RUNNER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runner}"
RUNNER_VENV="${RUNNER_VENV:-$RUNNER_CACHE/venv}"
RUNNER_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNNER_BUILD="${RUNNER_BUILD:-$RUNNER_ROOT/build}"
export RUNNER_CACHE RUNNER_VENV RUNNER_ROOT RUNNER_BUILD
export CCACHE_DIR="${CCACHE_DIR:-$RUNNER_CACHE/ccache}"
# Fresh clones in other directories reuse the compiler cache.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$RUNNER_ROOT}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
# One build's objects with debug information take about 4 GB: room for a few, so that a checkout's rebuilds do not
# evict what a fresh clone's build would hit (ccache's default of 5 GB holds about one).
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-20G}"
