// Tests that need a CUDA device: without one they print "SKIP: <reason>" and end, and ctest reports them as
// skipped (tests/skip_status.sh: when the test passed otherwise); scripts/gpu-check runs them on a GPU host.
#pragma once

#include <catch2/catch.hpp>

#include "runtime/core/device.h"

// Catch2 v2 has no SKIP: the warning carries the marker ctest looks for.
#define SKIP_WITHOUT_CUDA(what)                 \
  do {                                          \
    if (!runner::core::cuda_available()) {      \
      WARN("SKIP: no CUDA device: " << (what)); \
      return;                                   \
    }                                           \
  } while (false)
