// The old name of run_binding.h, kept only while bindings/nn_binding.cpp (being split) still includes it.
#pragma once

#include "bindings/run_binding.h"
