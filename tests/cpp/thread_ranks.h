// Ranks of a data-parallel job as threads of the test process, each with its own Gloo process group.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/core/launch_context.h"
#include "runtime/dist/launcher.h"
#include "runtime/dist/process_group.h"

namespace runner::test {

// Runs `rank_main(group, rank)` on `ranks` threads, each rank with its own Gloo group; rethrows the first rank's
// error. c10d's flight recorder (on by default, a process-wide singleton) adds a process group's status to a map
// outside its lock at the group's first collective, which the groups then race on (a crash in 1 of 2 runs). A rank
// of a real job is a process of its own; these tests record no trace.
inline void on_ranks(int ranks, const std::function<void(dist::ProcessGroup& group, int rank)>& rank_main) {
  ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/1);
  const int port = dist::free_store_port("127.0.0.1");  // as the launcher picks it
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank)
    threads.emplace_back([&, rank] {
      try {
        core::LaunchContext context;
        context.rank = rank;
        context.world_size = ranks;
        context.master_addr = "127.0.0.1";
        context.master_port = port;
        dist::ProcessGroup group(context, at::kCPU, std::chrono::seconds(30));
        rank_main(group, rank);
      } catch (...) {
        errors[static_cast<std::size_t>(rank)] = std::current_exception();
      }
    });
  for (std::thread& thread : threads) thread.join();
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
}

}  // namespace runner::test
