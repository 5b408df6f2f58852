// Catch2 entry point for the runtime tests (tests/cpp/*_test.cpp).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
