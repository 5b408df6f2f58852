// runner.dist: this process's place in a data-parallel job (rank, world size) and collectives on tensors.
// Every function also works in a single process, where the collectives are identities.
#include <ATen/ATen.h>

#include "bindings/binding.h"
#include "bindings/bindings.h"
#include "bindings/tensor_binding.h"
#include "runtime/core/launch_context.h"
#include "runtime/dist/process_group.h"

namespace runner::bindings {
namespace {

// runner.dist.barrier()
int dist_barrier(lua_State* L) {
  if (dist::ProcessGroup* group = dist::process_group()) group->barrier();
  (void)L;
  return 0;
}

// runner.dist.all_reduce(t [, op = "sum"]) -> t, reduced in place over the ranks
int dist_all_reduce(lua_State* L) {
  at::Tensor& tensor = check_tensor(L, 1);
  const dist::ReduceOp op = dist::parse_reduce_op(lua_isnoneornil(L, 2) ? "sum" : check_string(L, 2));
  if (dist::ProcessGroup* group = dist::process_group()) {
    if (!tensor.is_contiguous()) throw std::invalid_argument("all_reduce needs a contiguous tensor (t:contiguous())");
    std::vector<at::Tensor> tensors{tensor};
    group->all_reduce(tensors, op);
  }
  lua_settop(L, 1);
  return 1;
}

// runner.dist.broadcast(t [, root = 0]) -> t, rank root's values on every rank
int dist_broadcast(lua_State* L) {
  at::Tensor& tensor = check_tensor(L, 1);
  const std::int64_t root = opt_integer(L, 2, 0);
  if (dist::ProcessGroup* group = dist::process_group()) {
    if (!tensor.is_contiguous()) throw std::invalid_argument("broadcast needs a contiguous tensor (t:contiguous())");
    std::vector<at::Tensor> tensors{tensor};
    group->broadcast(tensors, static_cast<int>(root));
  } else if (root != 0) {
    throw std::invalid_argument(fmt::format("broadcast: root {} is not a rank of 1", root));
  }
  lua_settop(L, 1);
  return 1;
}

// runner.dist.all_gather(t) -> { t of rank 0, t of rank 1, ... }
int dist_all_gather(lua_State* L) {
  const at::Tensor& tensor = check_tensor(L, 1);
  std::vector<at::Tensor> gathered;
  if (dist::ProcessGroup* group = dist::process_group())
    gathered = group->all_gather(tensor);
  else
    gathered.push_back(tensor);
  lua_createtable(L, static_cast<int>(gathered.size()), 0);
  for (std::size_t i = 0; i < gathered.size(); ++i) {
    push_tensor(L, gathered[i]);
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  return 1;
}

void set_integer(lua_State* L, const char* name, std::int64_t value) {
  lua_pushnumber(L, static_cast<lua_Number>(value));
  lua_setfield(L, -2, name);
}

}  // namespace

void open_dist(lua_State* L) {
  const core::LaunchContext& launch = core::launch_context();
  lua_getglobal(L, "runner");
  lua_newtable(L);
  set_integer(L, "rank", launch.rank);
  set_integer(L, "world_size", launch.world_size);
  set_integer(L, "local_rank", launch.local_rank);
  set_integer(L, "local_world_size", launch.local_world_size);
  lua_pushboolean(L, launch.rank == 0);
  lua_setfield(L, -2, "is_main");
  set_functions(L, {{"barrier", wrap<dist_barrier>},
                    {"all_reduce", wrap<dist_all_reduce>},
                    {"broadcast", wrap<dist_broadcast>},
                    {"all_gather", wrap<dist_all_gather>}});
  lua_setfield(L, -2, "dist");
  lua_pop(L, 1);
}

}  // namespace runner::bindings
