// Tests of runtime/sweep/host_leases: workers' slots counted across processes, a dead worker's registration
// dropped, cores and GPUs leased to one trial at a time and free again when its lease ends.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "runtime/sweep/host_leases.h"
#include "tests/cpp/temp_directory.h"

using runner::sweep::HostLeases;
using runner::testing::TempDir;

TEST_CASE("host leases: the slots of every live worker on the host", "[sweep][leases]") {
  TempDir dir;
  const HostLeases mine(2, dir.path);
  CHECK(mine.slots_on_host() == 2);
  {
    const HostLeases other(3, dir.path);
    CHECK(mine.slots_on_host() == 5);
    CHECK(other.slots_on_host() == 5);
  }
  CHECK(mine.slots_on_host() == 2);
  // A worker killed outright leaves its registration behind, without its lock: it is not counted, and removed.
  const pid_t child = ::fork();
  if (child == 0) {
    new HostLeases(4, dir.path);  // never destroyed: the process ends as under kill -9
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(mine.slots_on_host() == 2);
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path))
    if (entry.path().filename().string().rfind("worker-", 0) == 0) names.insert(entry.path().filename().string());
  CHECK(names.size() == 1);
}

TEST_CASE("host leases: a core or a GPU goes to one trial at a time", "[sweep][leases]") {
  TempDir dir;
  const HostLeases first(1, dir.path);
  const HostLeases second(1, dir.path);
  const std::vector<std::string> gpus{"0", "GPU-8f1c/odd"};
  auto one = first.try_lease(2, 1, gpus, 1);
  REQUIRE(one);
  auto two = second.try_lease(2, 1, gpus, 1);
  REQUIRE(two);
  CHECK(one->threads() == 1);
  CHECK(one->gpus() != two->gpus());
  CHECK(one->gpus().size() == 1);
  if (!one->cpus().empty()) {  // pinned: this process may run on at least two CPUs
    REQUIRE(two->cpus().size() == 1);
    CHECK(one->cpus() != two->cpus());
  }
  CHECK_FALSE(first.try_lease(2, 1, gpus, 1));  // every core and GPU is held
  CHECK_FALSE(second.try_lease(2, 1, {}, 0));
  two.reset();
  auto three = second.try_lease(2, 1, gpus, 1);
  REQUIRE(three);
  // More threads than usable cores lease every core once.
  one.reset();
  three.reset();
  auto wide = first.try_lease(2, 8, {}, 0);
  REQUIRE(wide);
  CHECK(wide->threads() == 8);
  CHECK_FALSE(second.try_lease(2, 1, {}, 0));
}
