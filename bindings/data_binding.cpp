// runner.data natives: datasets (built-in and Lua-defined) and the loader as userdata.
#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "bindings/binding.h"
#include "bindings/bindings.h"
#include "bindings/data_binding.h"
#include "bindings/lua_json.h"
#include "bindings/option_table.h"
#include "bindings/run_binding.h"
#include "bindings/tensor_binding.h"
#include "runtime/core/clock.h"
#include "runtime/core/device.h"
#include "runtime/core/logging.h"
#include "runtime/data/data_error.h"
#include "runtime/data/datasets.h"
#include "runtime/data/loader.h"
#include "runtime/data/pack.h"

namespace runner::bindings {
namespace {

using data::Dataset;
using data::Loader;

constexpr const char* kDatasetType = "runner.Dataset";
constexpr const char* kLoaderType = "runner.Loader";

// A dataset whose samples come from a Lua function get(i) -> tensor [, label]; read on the Lua thread only.
class LuaDataset final : public Dataset {
 public:
  LuaDataset(lua_State* L, int function_index, std::int64_t length, std::string where)
      : main_(L), length_(length), where_(std::move(where)) {
    lua_pushvalue(L, function_index);
    function_ref_ = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  ~LuaDataset() override { luaL_unref(main_, LUA_REGISTRYINDEX, function_ref_); }

  // The state of the running coroutine, set by the binding before each read.
  void set_state(lua_State* L) const { current_ = L; }

  std::int64_t size() const override { return length_; }
  data::SampleKind kind() const override { return data::SampleKind::tensor; }
  std::string describe() const override {
    return "lua dataset defined at " + where_ + ": " + std::to_string(length_) + " samples";
  }
  bool has_labels() const override { return has_labels_; }
  bool reads_on_caller_thread() const override { return true; }
  std::string source(std::int64_t index) const override {
    return "lua dataset (" + where_ + ") sample " + std::to_string(index + 1);
  }

  void read(std::int64_t index, const data::ReadHint&, data::Sample& out) const override {
    lua_State* L = current_ ? current_ : main_;
    lua_rawgeti(L, LUA_REGISTRYINDEX, function_ref_);
    lua_pushinteger(L, static_cast<lua_Integer>(index + 1));
    lua_call(L, 1, 2);
    at::Tensor* tensor = test_tensor(L, -2);
    if (tensor == nullptr) {
      const std::string got = luaL_typename(L, -2);
      lua_pop(L, 2);
      throw data::DataError(
          "", source(index) + ": get(" + std::to_string(index + 1) + ") returned " + got + ", expected a tensor");
    }
    out.tensor = *tensor;
    if (lua_isnumber(L, -1)) {
      out.label = static_cast<std::int64_t>(lua_tonumber(L, -1));
      has_labels_ = true;
    } else {
      out.label = -1;
    }
    lua_pop(L, 2);
  }

 private:
  lua_State* main_;
  mutable lua_State* current_ = nullptr;
  int function_ref_ = LUA_NOREF;
  std::int64_t length_;
  std::string where_;
  mutable bool has_labels_ = false;
};

struct DatasetBox {
  std::shared_ptr<const Dataset> dataset;
};

struct LoaderBox {
  std::shared_ptr<Loader> loader;
  std::shared_ptr<const Dataset> dataset;
};

void point_lua_dataset_at(lua_State* L, const Dataset& dataset) {
  if (const auto* lua_dataset = dynamic_cast<const LuaDataset*>(&dataset)) lua_dataset->set_state(L);
}

int push_dataset(lua_State* L, std::shared_ptr<const Dataset> dataset) {
  new_userdata<DatasetBox>(L, kDatasetType, DatasetBox{std::move(dataset)});
  return 1;
}

const Dataset& check_dataset(lua_State* L, int index) {
  return *check_userdata<DatasetBox>(L, index, kDatasetType, "dataset")->dataset;
}

Loader& check_loader(lua_State* L, int index) { return *shared_loader(L, index); }

// The dataset constructors' options (data.image_folder{...}, ...), each declared once; `path` is required.
template <class Struct>
OptionField<Struct> path_option(std::string Struct::*member) {
  return option_with<Struct>(
      "path",
      [member](lua_State* L, const char* key, Struct& o) {
        read_option_value(L, key, o.*member);
        if ((o.*member).empty()) raise_error(L, "option 'path' must not be empty");
      },
      /*required=*/true);
}

struct ImageFolderOptions {
  std::string path;
  bool labels = false;  // the subfolder names are the classes
};
const OptionTable<ImageFolderOptions> kImageFolderOptions("data.image_folder", "ImageFolderOptions",
                                                          {path_option(&ImageFolderOptions::path),
                                                           option("labels", &ImageFolderOptions::labels)});

struct SplitDatasetOptions {
  std::string path;
  bool train = true;  // split = "train" or "test"
};
OptionField<SplitDatasetOptions> split_option() {
  return option_with<SplitDatasetOptions>("split", [](lua_State* L, const char* key, SplitDatasetOptions& o) {
    std::string split;
    read_option_value(L, key, split);
    if (split != "train" && split != "test") raise_error(L, "split must be 'train' or 'test', got '" + split + "'");
    o.train = split == "train";
  });
}
const OptionTable<SplitDatasetOptions> kCifar10Options("data.cifar10", "Cifar10Options",
                                                       {path_option(&SplitDatasetOptions::path), split_option()});
const OptionTable<SplitDatasetOptions> kMnistOptions("data.mnist", "MnistOptions",
                                                     {path_option(&SplitDatasetOptions::path), split_option()});

// data._image_folder(ImageFolderOptions)
int data_image_folder(lua_State* L) {
  const ImageFolderOptions o = kImageFolderOptions.read(L, 1);
  auto dataset = data::open_image_folder(o.path, o.labels);
  record_run_input(L, "data", o.path, [&] { return nlohmann::json{{"images", dataset->size()}}; });
  return push_dataset(L, dataset);
}
// data._cifar10(Cifar10Options)
int data_cifar10(lua_State* L) {
  const SplitDatasetOptions o = kCifar10Options.read(L, 1);
  auto dataset = data::open_cifar10(o.path, o.train);
  record_run_input(L, "data", o.path, [&] { return nlohmann::json{{"images", dataset->size()}}; });
  return push_dataset(L, dataset);
}
// data._mnist(MnistOptions)
int data_mnist(lua_State* L) {
  const SplitDatasetOptions o = kMnistOptions.read(L, 1);
  auto dataset = data::open_mnist(o.path, o.train);
  record_run_input(L, "data", o.path, [&] { return nlohmann::json{{"images", dataset->size()}}; });
  return push_dataset(L, dataset);
}

struct LatentsOptions {
  std::string path;
  double scale = 0;  // 0: the manifest's
};
const OptionTable<LatentsOptions> kLatentsOptions(
    "data.latents", "LatentsOptions",
    {path_option(&LatentsOptions::path),
     option_with<LatentsOptions>("scale", [](lua_State* L, const char* key, LatentsOptions& o) {
       if (lua_type(L, -1) != LUA_TNUMBER || lua_tonumber(L, -1) <= 0)
         raise_error(L, "latents: scale must be a positive number");
       read_option_value(L, key, o.scale);
     })});

// data._latents(LatentsOptions): scale nil takes the manifest's. The run records the encode manifest's source,
// preprocessing and VAE (path and sha256).
int data_latents(lua_State* L) {
  const LatentsOptions o = kLatentsOptions.read(L, 1);
  const std::string& path = o.path;
  auto dataset = data::open_latents(path, o.scale);
  record_run_input(L, "data", path, [&] {
    const nlohmann::json manifest = data::latents_manifest(path);
    nlohmann::json detail = {{"latents", dataset->size()}};
    for (const char* key : {"source", "images", "preprocessing", "flip", "vae"})
      if (manifest.contains(key)) detail[key] = manifest[key];
    return detail;
  });
  return push_dataset(L, dataset);
}

struct NpyOptions {
  std::string path;
  std::string labels;                // an .npy of int64 labels ("": none)
  std::vector<std::string> classes;  // their names: a list, or the path of a file with one a line
};
const OptionTable<NpyOptions> kNpyOptions(
    "data.npy", "NpyOptions",
    {path_option(&NpyOptions::path), option("labels", &NpyOptions::labels),
     option_with<NpyOptions>("classes", [](lua_State* L, const char*, NpyOptions& o) {
       if (lua_type(L, -1) == LUA_TSTRING) {
         o.classes = data::read_class_names(lua_tostring(L, -1));
         return;
       }
       if (!lua_istable(L, -1)) raise_error(L, "classes must be a list of strings or the path of a file of names");
       const int table = lua_gettop(L);
       for (int i = 1;; ++i) {
         lua_rawgeti(L, table, i);
         if (lua_isnil(L, -1)) {
           lua_pop(L, 1);
           break;
         }
         if (lua_type(L, -1) != LUA_TSTRING) raise_error(L, "classes must be a list of strings");
         o.classes.emplace_back(lua_tostring(L, -1));
         lua_pop(L, 1);
       }
     })});

// data._npy(NpyOptions)
int data_npy(lua_State* L) {
  const NpyOptions o = kNpyOptions.read(L, 1);
  auto dataset = data::open_npy(o.path, o.labels, o.classes);
  record_run_input(L, "data", o.path, [&] { return nlohmann::json{{"rows", dataset->size()}}; });
  if (!o.labels.empty()) record_run_input(L, "data", o.labels, [] { return nlohmann::json{{"role", "labels"}}; });
  return push_dataset(L, dataset);
}

const OptionTable<data::ShapesOptions> kShapesOptions("data.shapes", "ShapesOptions",
                                                      {
                                                          option("size", &data::ShapesOptions::size),
                                                          option("count", &data::ShapesOptions::count),
                                                          option("seed", &data::ShapesOptions::seed),
                                                          option("colours", &data::ShapesOptions::colours),
                                                          option("rotate", &data::ShapesOptions::rotate),
                                                      });

// loader:iter{from, to}: the batches after the first `from` (a count) up to batch `to`.
struct IterRange {
  std::optional<std::int64_t> from;
  std::optional<std::int64_t> to;  // none: no end
};
const OptionTable<IterRange> kIterRangeOptions(
    "loader:iter", "IterRange",
    {
        option_with<IterRange>("from",
                               [](lua_State* L, const char* key, IterRange& o) {
                                 if (lua_type(L, -1) != LUA_TNUMBER || lua_tonumber(L, -1) < 0)
                                   raise_error(L, "loader:iter: 'from' must be a count of batches, 0 or more");
                                 read_option_value(L, key, o.from);
                               }),
        option("to", &IterRange::to),
    });

// data.shapes(ShapesOptions)
int data_shapes(lua_State* L) { return push_dataset(L, data::make_shapes(kShapesOptions.read(L, 1))); }

struct LuaDatasetOptions {
  std::int64_t length = 0;
};
const OptionTable<LuaDatasetOptions> kLuaDatasetOptions("data.dataset", "LuaDatasetOptions",
                                                        {option("length", &LuaDatasetOptions::length,
                                                                /*required=*/true),
                                                         lua_option<LuaDatasetOptions>("get", /*required=*/true)});

// data._lua_dataset(LuaDatasetOptions): get(i) -> sample [, label]
int data_lua_dataset(lua_State* L) {
  const std::int64_t length = kLuaDatasetOptions.read(L, 1).length;
  lua_getfield(L, 1, "get");
  if (!lua_isfunction(L, -1)) raise_error(L, "data.dataset: option 'get' must be a function");
  const int get = lua_gettop(L);
  if (length < 1) raise_error(L, "dataset: length must be positive, got " + std::to_string(length));
  std::string where = user_where(L);
  if (where.size() >= 2) where.resize(where.size() - 2);  // drop the ": "
  return push_dataset(L, std::make_shared<LuaDataset>(L, get, length, where.empty() ? "?" : where));
}

int dataset_len(lua_State* L) {
  lua_pushinteger(L, static_cast<lua_Integer>(check_dataset(L, 1).size()));
  return 1;
}

int dataset_tostring(lua_State* L) {
  const std::string text = check_dataset(L, 1).describe();
  lua_pushlstring(L, text.data(), text.size());
  return 1;
}

int dataset_classes(lua_State* L) {
  const std::vector<std::string> classes = check_dataset(L, 1).classes();
  lua_createtable(L, static_cast<int>(classes.size()), 0);
  for (std::size_t i = 0; i < classes.size(); ++i) {
    lua_pushlstring(L, classes[i].data(), classes[i].size());
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  return 1;
}

// dataset:get(i) -> sample (uint8 [C, H, W] for images, the stored tensor otherwise), label or nil
int dataset_get(lua_State* L) {
  const Dataset& dataset = check_dataset(L, 1);
  const std::int64_t position = check_integer(L, 2);
  if (position < 1 || position > dataset.size()) {
    raise_error(
        L, "dataset:get: index " + std::to_string(position) + " is out of range 1.." + std::to_string(dataset.size()));
  }
  point_lua_dataset_at(L, dataset);
  data::Sample sample;
  dataset.read(position - 1, data::ReadHint{}, sample);
  if (dataset.kind() == data::SampleKind::image) {
    const data::DecodedImage& image = sample.image;
    at::Tensor hwc = at::from_blob(sample.image.pixels.data(), {image.height, image.width, image.channels}, at::kByte);
    push_tensor(L, hwc.permute({2, 0, 1}).clone(at::MemoryFormat::Contiguous));  // owns its pixels
  } else {
    push_tensor(L, sample.tensor.clone());
  }
  if (sample.label >= 0)
    lua_pushinteger(L, static_cast<lua_Integer>(sample.label));
  else
    lua_pushnil(L);
  return 2;
}

// A crop size at the top of the stack: n or {h, w}.
void crop_size(lua_State* L, const char* key, int& height, int& width) {
  if (lua_type(L, -1) == LUA_TNUMBER) {
    height = width = static_cast<int>(lua_tointeger(L, -1));
  } else if (lua_istable(L, -1)) {
    lua_rawgeti(L, -1, 1);
    lua_rawgeti(L, -2, 2);
    height = static_cast<int>(lua_tointeger(L, -2));
    width = static_cast<int>(lua_tointeger(L, -1));
    lua_pop(L, 2);
  } else {
    raise_error(L, std::string("transform option '") + key + "' must be a size n or {height, width}");
  }
  if (height < 1 || width < 1) raise_error(L, std::string("transform option '") + key + "' must be positive");
}

void read_crop(lua_State* L, const char* key, data::TransformSpec& spec) {
  if (spec.crop_height > 0) raise_error(L, "transform takes either 'crop' (center) or 'random_crop', not both");
  crop_size(L, key, spec.crop_height, spec.crop_width);
  spec.random_crop = std::string_view(key) == "random_crop";
}

const OptionTable<data::TransformSpec> kTransformOptions(
    "transform", "TransformOptions",
    {
        option_with<data::TransformSpec>("resize",
                                         [](lua_State* L, const char* key, data::TransformSpec& spec) {
                                           read_option_value(L, key, spec.resize);
                                           if (spec.resize < 0)
                                             raise_error(L, "transform option 'resize' must be positive");
                                         }),
        option_with<data::TransformSpec>("crop", read_crop),
        option_with<data::TransformSpec>("random_crop", read_crop),
        option("flip", &data::TransformSpec::flip),
        option("normalize", &data::TransformSpec::normalize),
        option("fast_decode", &data::TransformSpec::fast_decode),
    });

const OptionTable<data::LoaderOptions> kLoaderOptions(
    "loader", "LoaderOptions",
    {
        option("batch", &data::LoaderOptions::batch, /*required=*/true),
        option("shuffle", &data::LoaderOptions::shuffle),
        option("drop_last", &data::LoaderOptions::drop_last),
        option_with<data::LoaderOptions>("workers",
                                         [](lua_State* L, const char* key, data::LoaderOptions& o) {
                                           read_option_value(L, key, o.workers);
                                           if (o.workers < 0) raise_error(L, "loader: workers must be 0 or more");
                                         }),
        option("prefetch", &data::LoaderOptions::prefetch),
        option_with<data::LoaderOptions>("seed",
                                         [](lua_State* L, const char* key, data::LoaderOptions& o) {
                                           if (lua_type(L, -1) == LUA_TNUMBER && lua_tonumber(L, -1) < 0)
                                             raise_error(L, "loader: seed must be non-negative");
                                           read_option_value(L, key, o.seed);
                                         }),
        option("rank", &data::LoaderOptions::rank),
        option("world_size", &data::LoaderOptions::world_size),
        option_with<data::LoaderOptions>("device",
                                         [](lua_State* L, const char* key, data::LoaderOptions& o) {
                                           std::string name;
                                           read_option_value(L, key, name);
                                           o.device = core::parse_device(name);
                                         }),
        option("pin_memory", &data::LoaderOptions::pin_memory),
        option_with<data::LoaderOptions>("transform",
                                         [](lua_State* L, const char*, data::LoaderOptions& o) {
                                           if (!lua_istable(L, -1))
                                             raise_error(L, "option 'transform' must be a table");
                                           o.transform = kTransformOptions.read(L, lua_gettop(L));
                                         }),
        option_with<data::LoaderOptions>("on_error",
                                         [](lua_State* L, const char* key, data::LoaderOptions& o) {
                                           std::string name;
                                           read_option_value(L, key, name);
                                           if (name != "raise" && name != "skip")
                                             raise_error(
                                                 L, "loader: on_error must be 'raise' or 'skip', got '" + name + "'");
                                           o.on_error = name == "skip" ? data::BadSamplePolicy::skip
                                                                       : data::BadSamplePolicy::raise;
                                         }),
    });

// data._loader(dataset, options)
int data_loader(lua_State* L) {
  auto* dataset_box = check_userdata<DatasetBox>(L, 1, kDatasetType, "dataset");
  luaL_checktype(L, 2, LUA_TTABLE);
  data::LoaderOptions options = kLoaderOptions.read(L, 2);
  auto loader = std::make_shared<Loader>(dataset_box->dataset, std::move(options));
  new_userdata<LoaderBox>(L, kLoaderType, LoaderBox{std::move(loader), dataset_box->dataset});
  return 1;
}

void set_integer(lua_State* L, const char* key, std::int64_t value) {
  lua_pushinteger(L, static_cast<lua_Integer>(value));
  lua_setfield(L, -2, key);
}

void set_number(lua_State* L, const char* key, double value) {
  lua_pushnumber(L, value);
  lua_setfield(L, -2, key);
}

// loader:next() -> {data =, label =, index =, step =, epoch =, wait_s =}; logs each bad file the skip policy left
// out, once.
int loader_next(lua_State* L) {
  Loader& loader = check_loader(L, 1);
  point_lua_dataset_at(L, loader.dataset());
  const double asked = core::steady_seconds();
  data::Batch batch = loader.next();
  const double wait_seconds = core::steady_seconds() - asked;
  for (const data::SkippedSample& skipped : loader.take_new_skip_reports())
    core::log(core::LogLevel::warn, "data: skipped a bad sample: " + skipped.message);
  lua_createtable(L, 0, 6);
  push_tensor(L, std::move(batch.data));
  lua_setfield(L, -2, "data");
  if (batch.label.defined()) {
    push_tensor(L, std::move(batch.label));
    lua_setfield(L, -2, "label");
  }
  push_tensor(L, std::move(batch.index));
  lua_setfield(L, -2, "index");
  set_integer(L, "step", batch.position + 1);
  set_integer(L, "epoch", lua_epoch(batch.epoch));
  set_number(L, "wait_s", wait_seconds);
  return 1;
}

// The function loader:iter returns; upvalues: the loader, the position to stop at (nil: none).
int loader_iterator(lua_State* L) {
  const Loader& loader = check_loader(L, lua_upvalueindex(1));
  if (!lua_isnil(L, lua_upvalueindex(2)) && loader.position() >= lua_tointeger(L, lua_upvalueindex(2))) {
    lua_pushnil(L);
    return 1;
  }
  lua_settop(L, 0);
  lua_pushvalue(L, lua_upvalueindex(1));
  return loader_next(L);
}

// loader:iter() iterates over the rest of the current epoch; loader:iter{from = a, to = b} yields the batches
// after the first `a` (a count of batches, e.g. the steps already done) up to batch `b`, across epochs, so a
// resumed run sees exactly the batches an uninterrupted one would have.
int loader_iter(lua_State* L) {
  Loader& loader = check_loader(L, 1);
  std::optional<std::int64_t> stop;
  if (lua_isnoneornil(L, 2)) {
    const std::int64_t per_epoch = loader.batches_per_epoch();
    stop = (loader.position() / per_epoch + 1) * per_epoch;
  } else {
    const IterRange range = kIterRangeOptions.read(L, 2);
    if (range.from) loader.seek(*range.from);
    stop = range.to;
  }
  loader.set_end(stop.value_or(-1));
  lua_settop(L, 1);
  if (stop)
    lua_pushinteger(L, static_cast<lua_Integer>(*stop));
  else
    lua_pushnil(L);
  lua_pushcclosure(L, wrap<loader_iterator>, 2);
  return 1;
}

int loader_len(lua_State* L) {
  lua_pushinteger(L, static_cast<lua_Integer>(check_loader(L, 1).batches_per_epoch()));
  return 1;
}

int loader_position(lua_State* L) {
  lua_pushinteger(L, static_cast<lua_Integer>(check_loader(L, 1).position()));
  return 1;
}

int loader_seek(lua_State* L) {
  Loader& loader = check_loader(L, 1);
  const std::int64_t position = check_integer(L, 2);
  if (position < 0) raise_error(L, "loader:seek: position must be 0 or more, got " + std::to_string(position));
  loader.seek(position);
  return 0;
}

int loader_set_end(lua_State* L) {
  check_loader(L, 1).set_end(lua_isnoneornil(L, 2) ? -1 : check_integer(L, 2));
  return 0;
}

// loader:indices(step) -> int64 tensor of the 0-based dataset indices of batch `step` (1-based) for this rank
int loader_indices(lua_State* L) {
  Loader& loader = check_loader(L, 1);
  const std::int64_t step = check_integer(L, 2);
  if (step < 1) raise_error(L, "loader:indices: step must be 1 or more, got " + std::to_string(step));
  const std::vector<std::int64_t> indices = loader.batch_indices(step - 1);
  push_tensor(L, at::tensor(indices, at::kLong));
  return 1;
}

// loader:state() -> {seed, position, dataset_size, batch, rank, world_size, shuffle, drop_last}
int loader_state(lua_State* L) {
  push_json(L, data::loader_state_json(check_loader(L, 1).state()));
  return 1;
}

// loader:restore(state): continues where the state was taken (a different setup is an error).
int loader_restore(lua_State* L) {
  Loader& loader = check_loader(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  loader.restore(data::loader_state_from_json(to_json(L, 2, "loader state"), "loader:restore"));
  return 0;
}

int loader_stats(lua_State* L) {
  const data::LoaderStats stats = check_loader(L, 1).stats();
  lua_createtable(L, 0, 9);
  set_number(L, "wait_s", stats.wait_seconds);
  set_number(L, "elapsed_s", stats.elapsed_seconds);
  set_integer(L, "batches", stats.batches);
  set_integer(L, "samples", stats.samples);
  set_integer(L, "skipped", stats.skipped);
  set_integer(L, "queue_depth", stats.queue_depth);
  set_integer(L, "workers", stats.workers);
  set_number(L, "batches_per_s", stats.elapsed_seconds > 0 ? stats.batches / stats.elapsed_seconds : 0.0);
  set_number(L, "images_per_s", stats.elapsed_seconds > 0 ? stats.samples / stats.elapsed_seconds : 0.0);
  return 1;
}

void push_skip_reports(lua_State* L, const std::vector<data::SkippedSample>& reports) {
  lua_createtable(L, static_cast<int>(reports.size()), 0);
  for (std::size_t i = 0; i < reports.size(); ++i) {
    lua_createtable(L, 0, 2);
    lua_pushstring(L, reports[i].path.c_str());
    lua_setfield(L, -2, "path");
    lua_pushstring(L, reports[i].message.c_str());
    lua_setfield(L, -2, "message");
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
}

// loader:skip_reports() -> {path =, message =} for every file skipped so far
int loader_skip_reports(lua_State* L) {
  push_skip_reports(L, check_loader(L, 1).skip_reports());
  return 1;
}

int loader_dataset(lua_State* L) {
  auto* box = check_userdata<LoaderBox>(L, 1, kLoaderType, "loader");
  return push_dataset(L, box->dataset);
}

int loader_tostring(lua_State* L) {
  const Loader& loader = check_loader(L, 1);
  const data::LoaderOptions& o = loader.options();
  const std::string text =
      fmt::format("loader({}; batch {}, {} batches per epoch, {} workers, {})", loader.dataset().describe(), o.batch,
                  loader.batches_per_epoch(), o.workers, core::device_name(o.device));
  lua_pushlstring(L, text.data(), text.size());
  return 1;
}

void set_metamethods(lua_State* L, const char* type_name, lua_CFunction len, lua_CFunction tostring) {
  luaL_getmetatable(L, type_name);
  lua_pushcfunction(L, len);
  lua_setfield(L, -2, "__len");
  lua_pushcfunction(L, tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
}

}  // namespace

std::shared_ptr<data::Loader> shared_loader(lua_State* L, int index) {
  return check_userdata<LoaderBox>(L, index, kLoaderType, "loader")->loader;
}

void open_data(lua_State* L) {
  new_metatable<DatasetBox>(
      L, kDatasetType, {{"get", wrap<dataset_get>}, {"classes", wrap<dataset_classes>}, {"len", wrap<dataset_len>}});
  lua_pop(L, 1);
  set_metamethods(L, kDatasetType, wrap<dataset_len>, wrap<dataset_tostring>);

  new_metatable<LoaderBox>(L, kLoaderType,
                           {{"next", wrap<loader_next>},
                            {"iter", wrap<loader_iter>},
                            {"len", wrap<loader_len>},
                            {"position", wrap<loader_position>},
                            {"seek", wrap<loader_seek>},
                            {"set_end", wrap<loader_set_end>},
                            {"indices", wrap<loader_indices>},
                            {"state", wrap<loader_state>},
                            {"restore", wrap<loader_restore>},
                            {"stats", wrap<loader_stats>},
                            {"skip_reports", wrap<loader_skip_reports>},
                            {"dataset", wrap<loader_dataset>}});
  lua_pop(L, 1);
  set_metamethods(L, kLoaderType, wrap<loader_len>, wrap<loader_tostring>);

  lua_getglobal(L, "runner");
  lua_newtable(L);
  set_functions(L, {{"image_folder", wrap<data_image_folder>},
                    {"cifar10", wrap<data_cifar10>},
                    {"mnist", wrap<data_mnist>},
                    {"npy", wrap<data_npy>},
                    {"latents", wrap<data_latents>},
                    {"shapes", wrap<data_shapes>},
                    {"lua_dataset", wrap<data_lua_dataset>},
                    {"loader", wrap<data_loader>}});
  lua_setfield(L, -2, "_data");
  lua_pop(L, 1);
}

}  // namespace runner::bindings
