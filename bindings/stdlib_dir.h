// Where runner's Lua standard library (stdlib/ of the checkout this build was configured from) lies.
#pragma once

namespace runner::bindings {

// The absolute path of stdlib/, without a trailing slash. It is written into one generated source file in the build
// folder (bindings/stdlib_dir.cpp.in), not into a compile flag: the other objects then compile the same in every
// clone and checkout, and a second clone's build takes them from ccache.
const char* stdlib_dir();

}  // namespace runner::bindings
