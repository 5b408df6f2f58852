// runner.eval: how good generated samples are: a download-free quality number (runner.eval.sliced_wasserstein)
// and FID (runner.eval.fid, fid_stats).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>
#include <memory>

#include "bindings/bindings.h"
#include "bindings/option_table.h"
#include "bindings/tensor_binding.h"
#include "runtime/eval/fid.h"
#include "runtime/eval/sliced_wasserstein.h"

namespace runner::bindings {

namespace {

const OptionTable<eval::SlicedWassersteinOptions> kSlicedWassersteinOptions(
    "sliced_wasserstein", "SlicedWassersteinOptions",
    {
        option("resolution", &eval::SlicedWassersteinOptions::resolution),
        option("projections", &eval::SlicedWassersteinOptions::projections),
        option("seed", &eval::SlicedWassersteinOptions::seed),
    });

const OptionTable<eval::FidOptions> kFidOptions("fid", "FidOptions",
                                                {
                                                    option("weights", &eval::FidOptions::weights),
                                                    option("batch", &eval::FidOptions::batch),
                                                    option("device", &eval::FidOptions::device),
                                                });

// runner.eval.sliced_wasserstein(a, b [, {resolution = 16, projections = 512, seed = 0}]) -> number
int sliced_wasserstein(lua_State* L) {
  const eval::SlicedWassersteinOptions o = kSlicedWassersteinOptions.read(L, 3);
  lua_pushnumber(L, eval::sliced_wasserstein(check_tensor(L, 1), check_tensor(L, 2), o));
  return 1;
}

eval::FidOptions fid_options(lua_State* L, int index, const char* function) {
  const eval::FidOptions o = kFidOptions.read_as(function, L, index);
  if (o.weights.empty())
    raise_error(
        L, fmt::format("{}: give weights = the FID Inception weights file (or the same tensors as safetensors): {}",
                       function, eval::fid_weights_help()));
  return o;
}

// The evaluator of these options, loaded once per process (the network is about 100 MB).
eval::FidEvaluator& fid_evaluator(const eval::FidOptions& o) {
  static std::map<std::string, std::unique_ptr<eval::FidEvaluator>> evaluators;
  const std::string key = o.weights + "\n" + o.device + "\n" + std::to_string(o.batch);
  auto found = evaluators.find(key);
  if (found == evaluators.end()) found = evaluators.emplace(key, std::make_unique<eval::FidEvaluator>(o)).first;
  return *found->second;
}

// Images [N, 3, H, W] in [-1, 1], a folder of images, or an .npz of statistics.
eval::FidStatistics fid_source(lua_State* L, int index, const eval::FidOptions& o) {
  if (lua_type(L, index) == LUA_TSTRING) {
    const std::string path = lua_tostring(L, index);
    if (path.size() > 4 && path.compare(path.size() - 4, 4, ".npz") == 0) return eval::read_fid_statistics(path);
    return fid_evaluator(o).of_folder(path);
  }
  return fid_evaluator(o).of_images(check_tensor(L, index));
}

// runner.eval.fid(a, b, {weights = PATH [, batch = 50, device = "auto"]}) -> number
int fid(lua_State* L) {
  const eval::FidOptions o = fid_options(L, 3, "fid");
  const eval::FidStatistics a = fid_source(L, 1, o);
  const eval::FidStatistics b = fid_source(L, 2, o);
  lua_pushnumber(L, eval::frechet_distance(a, b));
  return 1;
}

// runner.eval.fid_stats(images_or_folder, {weights = PATH [, batch, device]}) -> mu, sigma (float64)
int fid_stats(lua_State* L) {
  const eval::FidStatistics statistics = fid_source(L, 1, fid_options(L, 2, "fid_stats"));
  push_tensor(L, statistics.mu);
  push_tensor(L, statistics.sigma);
  return 2;
}

}  // namespace

void open_eval(lua_State* L) {
  lua_getglobal(L, "runner");
  lua_newtable(L);
  set_functions(L,
                {{"sliced_wasserstein", wrap<sliced_wasserstein>}, {"fid", wrap<fid>}, {"fid_stats", wrap<fid_stats>}});
  lua_setfield(L, -2, "eval");
  lua_pop(L, 1);
}

}  // namespace runner::bindings
