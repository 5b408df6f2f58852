// Reading torch.save's zip format: the zip through LibTorch's PyTorchStreamReader, the pickle through a small
// unpickler of our own that knows the few classes a state dict uses and constructs nothing else.
#include "runtime/ckpt/pytorch_file.h"

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <unordered_map>

namespace runner::ckpt {
namespace {

std::string first_line(const std::string& text) {
  const auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

// The callables a state dict's pickle names, and argparse.Namespace (the `args` of DiT's train.py
// checkpoints); anything else is refused by name.
enum class Callable { none, ordered_dict, rebuild_tensor, rebuild_parameter, storage_type, namespace_class };

struct Item {
  c10::IValue value;
  Callable callable = Callable::none;
  bool takes_attributes = false;  // a Namespace, built as a dict: BUILD's state dict holds its attributes
};

std::optional<at::ScalarType> storage_dtype(const std::string& name) {
  static const std::map<std::string, at::ScalarType> kStorages = {{"FloatStorage", at::kFloat},
                                                                  {"DoubleStorage", at::kDouble},
                                                                  {"HalfStorage", at::kHalf},
                                                                  {"BFloat16Storage", at::kBFloat16},
                                                                  {"LongStorage", at::kLong},
                                                                  {"IntStorage", at::kInt},
                                                                  {"ShortStorage", at::kShort},
                                                                  {"CharStorage", at::kChar},
                                                                  {"ByteStorage", at::kByte},
                                                                  {"BoolStorage", at::kBool},
                                                                  {"UntypedStorage", at::kByte},
                                                                  {"ComplexFloatStorage", at::kComplexFloat},
                                                                  {"ComplexDoubleStorage", at::kComplexDouble}};
  const auto found = kStorages.find(name);
  if (found == kStorages.end()) return std::nullopt;
  return found->second;
}

// Runs pickles from a byte buffer. Storages come from the zip's records (zip) or, in the legacy format, are
// allocated when named and filled from the raw data after the pickles (fill_legacy_storages).
class Unpickler {
 public:
  Unpickler(const std::string& path, const std::uint8_t* data, size_t size, caffe2::serialize::PyTorchStreamReader* zip)
      : path_(path), data_(data), size_(size), zip_(zip) {}

  // After the legacy format's pickles: for each key, an int64 element count and the storage's bytes.
  void fill_legacy_storages(const c10::IValue& keys) {
    if (!keys.isList()) fail("the legacy storage key list is missing");
    for (const auto& key : keys.toListRef()) {
      if (!key.isString() || !storages_.count(key.toStringRef()))
        fail("the legacy storage key list names an unknown storage");
      at::Tensor& storage = storages_.at(key.toStringRef());
      std::int64_t numel;
      std::memcpy(&numel, bytes(8), 8);
      if (numel != storage.numel())
        fail(fmt::format("legacy storage {} holds {} elements, not {}", key.toStringRef(), numel, storage.numel()));
      const size_t count = static_cast<size_t>(numel) * storage.element_size();
      std::memcpy(storage.data_ptr(), bytes(count), count);
    }
  }

  c10::IValue run() {
    while (true) {
      const std::uint8_t op = byte();
      switch (op) {
        case 0x80:
          byte();
          break;  // PROTO
        case 0x95:
          bytes(8);
          break;  // FRAME
        case '.':
          return pop().value;  // STOP
        case '(':
          marks_.push_back(stack_.size());
          break;
        case '}':
          push(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
          break;
        case ']':
          push(c10::impl::GenericList(c10::AnyType::get()));
          break;
        case ')':
          push(c10::ivalue::Tuple::create({}));
          break;
        case 't':
          push(tuple_of(pop_mark()));
          break;
        case 0x85:
        case 0x86:
        case 0x87: {  // TUPLE1..3
          std::vector<Item> items(static_cast<size_t>(op - 0x84));
          for (auto it = items.rbegin(); it != items.rend(); ++it) *it = pop();
          push(tuple_of(items));
        } break;
        case 'd': {  // DICT
          auto items = pop_mark();
          auto dict = c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
          for (size_t i = 0; i + 1 < items.size(); i += 2) dict.insert_or_assign(key(items[i]), items[i + 1].value);
          push(dict);
        } break;
        case 'a': {
          Item value = pop();
          list(top()).push_back(value.value);
        } break;
        case 'e': {
          auto items = pop_mark();
          auto target = list(top());
          for (auto& item : items) target.push_back(item.value);
        } break;
        case 's': {
          Item value = pop();
          Item k = pop();
          dict(top()).insert_or_assign(key(k), value.value);
        } break;
        case 'u': {
          auto items = pop_mark();
          auto target = dict(top());
          for (size_t i = 0; i + 1 < items.size(); i += 2) target.insert_or_assign(key(items[i]), items[i + 1].value);
        } break;
        case 'q':
          memo_[byte()] = top();
          break;
        case 'r':
          memo_[uint32()] = top();
          break;
        case 0x94:
          memo_[static_cast<std::uint32_t>(memo_.size())] = top();
          break;  // MEMOIZE
        case 'h':
          push_item(memo(byte()));
          break;
        case 'j':
          push_item(memo(uint32()));
          break;
        case 'J':
          push(static_cast<std::int64_t>(static_cast<std::int32_t>(uint32())));
          break;
        case 'K':
          push(static_cast<std::int64_t>(byte()));
          break;
        case 'M':
          push(static_cast<std::int64_t>(byte() | (byte() << 8)));
          break;
        case 0x8a:
          push(long1());
          break;
        case 'G':
          push(binfloat());
          break;
        case 'X':
          push(string(uint32()));
          break;
        case 0x8c:
          push(string(byte()));
          break;
        case 0x8d:
          push(string(static_cast<size_t>(uint64())));
          break;
        case 'C':
          push(string(byte()));
          break;
        case 'B':
          push(string(uint32()));
          break;
        case 'N':
          push(c10::IValue());
          break;
        case 0x88:
          push(true);
          break;
        case 0x89:
          push(false);
          break;
        case '0':
          pop();
          break;
        case '1':
          pop_mark();
          break;
        case '2':
          push_item(top());
          break;
        case 'c': {
          const std::string module = line();
          push_item(global(module, line()));
        } break;
        case 0x93: {  // STACK_GLOBAL
          const std::string name = pop().value.toStringRef();
          push_item(global(pop().value.toStringRef(), name));
        } break;
        case 'R': {
          Item args = pop();
          Item callable = pop();
          push(call(callable, args));
        } break;
        case 0x81: {
          pop();
          push_item(new_object(pop()));
        } break;  // NEWOBJ: cls.__new__(cls, *args)
        case 'b':
          build(pop());
          break;
        case 'Q':
          push(persistent(pop()));
          break;
        default:
          fail(fmt::format("unsupported pickle opcode 0x{:02x} at byte {}", op, position_ - 1));
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& message) const {
    throw std::invalid_argument(fmt::format("{}: cannot read this torch.save file: {}", path_, message));
  }

  const std::uint8_t* bytes(size_t n) {
    if (n > size_ - position_) fail("the pickle ends early (the file is damaged)");
    const std::uint8_t* at = data_ + position_;
    position_ += n;
    return at;
  }
  std::uint8_t byte() { return *bytes(1); }
  std::uint32_t uint32() {
    std::uint32_t value;
    std::memcpy(&value, bytes(4), 4);
    return value;
  }
  std::uint64_t uint64() {
    std::uint64_t value;
    std::memcpy(&value, bytes(8), 8);
    return value;
  }
  std::int64_t long1() {
    const size_t n = byte();
    if (n > 8) fail("an integer wider than 64 bits");
    const std::uint8_t* at = bytes(n);
    std::uint64_t value = 0;
    for (size_t i = 0; i < n; ++i) value |= static_cast<std::uint64_t>(at[i]) << (8 * i);
    if (n > 0 && n < 8 && (at[n - 1] & 0x80)) value |= ~std::uint64_t{0} << (8 * n);  // sign extension
    return static_cast<std::int64_t>(value);
  }
  double binfloat() {
    const std::uint8_t* at = bytes(8);
    std::uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = (bits << 8) | at[i];  // big-endian
    double value;
    std::memcpy(&value, &bits, 8);
    return value;
  }
  std::string string(size_t n) {
    const std::uint8_t* at = bytes(n);
    return std::string(reinterpret_cast<const char*>(at), n);
  }
  std::string line() {
    std::string text;
    while (true) {
      const char c = static_cast<char>(byte());
      if (c == '\n') return text;
      text.push_back(c);
    }
  }

  void push(c10::IValue value) { stack_.push_back({std::move(value)}); }
  void push_item(Item item) { stack_.push_back(std::move(item)); }
  Item pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) fail("the pickle's stack underflows");
    Item item = std::move(stack_.back());
    stack_.pop_back();
    return item;
  }
  Item& top() {
    if (stack_.empty()) fail("the pickle's stack underflows");
    return stack_.back();
  }
  std::vector<Item> pop_mark() {
    if (marks_.empty()) fail("the pickle has no mark");
    const size_t start = marks_.back();
    marks_.pop_back();
    std::vector<Item> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(start)),
                            std::make_move_iterator(stack_.end()));
    stack_.resize(start);
    return items;
  }
  Item memo(std::uint32_t index) {
    const auto found = memo_.find(index);
    if (found == memo_.end()) fail(fmt::format("memo entry {} is missing", index));
    return found->second;
  }

  c10::IValue tuple_of(const std::vector<Item>& items) {
    std::vector<c10::IValue> values;
    for (const Item& item : items) values.push_back(item.value);
    return c10::ivalue::Tuple::create(std::move(values));
  }
  c10::impl::GenericList list(Item& item) {
    if (!item.value.isList()) fail("APPEND to something that is not a list");
    return item.value.toList();
  }
  c10::impl::GenericDict dict(Item& item) {
    if (!item.value.isGenericDict()) fail("SETITEM on something that is not a dict");
    return item.value.toGenericDict();
  }
  c10::IValue key(const Item& item) {
    if (!item.value.isString() && !item.value.isInt()) fail("a dict key that is not a string or an integer");
    return item.value;
  }

  Item global(const std::string& module, const std::string& name) {
    Item item;
    if (module == "collections" && name == "OrderedDict")
      item.callable = Callable::ordered_dict;
    else if (module == "argparse" && name == "Namespace")
      item.callable = Callable::namespace_class;
    else if (module == "torch._utils" && name == "_rebuild_tensor_v2")
      item.callable = Callable::rebuild_tensor;
    else if (module == "torch._utils" && (name == "_rebuild_parameter" || name == "_rebuild_parameter_with_state"))
      item.callable = Callable::rebuild_parameter;
    else if (module == "torch" && storage_dtype(name)) {
      item.callable = Callable::storage_type;
      item.value = static_cast<std::int64_t>(*storage_dtype(name));  // read back by persistent()
    } else {
      throw std::invalid_argument(fmt::format(
          "{}: holds a Python object of class {}.{}; runner reads files of tensors, dicts, lists, tuples, numbers, "
          "strings and argparse.Namespace only (no code runs on load); save a state dict: "
          "torch.save(model.state_dict(), path)",
          path_, module, name));
    }
    return item;
  }

  std::vector<std::int64_t> integers(const c10::IValue& value, const char* what) {
    if (!value.isTuple()) fail(fmt::format("a tensor's {} is not a tuple", what));
    std::vector<std::int64_t> result;
    for (const auto& element : value.toTupleRef().elements()) {
      if (!element.isInt()) fail(fmt::format("a tensor's {} holds a non-integer", what));
      result.push_back(element.toInt());
    }
    return result;
  }

  // An argparse.Namespace as an empty dict that BUILD fills with its attributes; no other class is made.
  Item new_object(const Item& cls) {
    if (cls.callable != Callable::namespace_class) fail("NEWOBJ of something that is not argparse.Namespace");
    Item item;
    item.value = c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
    item.takes_attributes = true;
    return item;
  }

  // BUILD: a Namespace's attributes; otherwise an OrderedDict's _metadata (module versions), which a state dict
  // does not need.
  void build(const Item& state) {
    if (!top().takes_attributes) return;
    if (!state.value.isGenericDict()) fail("an argparse.Namespace whose state is not a dict");
    auto attributes = dict(top());
    for (const auto& entry : state.value.toGenericDict())
      attributes.insert_or_assign(key({entry.key()}), entry.value());
  }

  c10::IValue call(const Item& callable, const Item& args) {
    if (!args.value.isTuple()) fail("REDUCE without an argument tuple");
    const auto& elements = args.value.toTupleRef().elements();
    switch (callable.callable) {
      case Callable::ordered_dict:
        return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
      case Callable::rebuild_parameter:
        if (elements.empty() || !elements[0].isTensor()) fail("a Parameter without its tensor");
        return elements[0];
      case Callable::rebuild_tensor: {
        // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
        if (elements.size() < 4 || !elements[0].isTensor() || !elements[1].isInt())
          fail("a tensor with unexpected arguments");
        const at::Tensor& storage = elements[0].toTensor();
        const auto sizes = integers(elements[2], "size");
        const auto strides = integers(elements[3], "stride");
        if (sizes.size() != strides.size()) fail("a tensor whose size and stride differ in length");
        const std::int64_t offset = elements[1].toInt();
        std::int64_t last = offset;
        for (size_t i = 0; i < sizes.size(); ++i) {
          if (sizes[i] < 0 || strides[i] < 0) fail("a tensor with a negative size or stride");
          if (sizes[i] == 0)
            last = -1;
          else if (last >= 0)
            last += (sizes[i] - 1) * strides[i];
        }
        if (offset < 0 || last >= storage.numel()) fail("a tensor reaches past its storage");
        return at::empty({0}, storage.options()).set_(storage.storage(), offset, sizes, strides);
      }
      default:
        fail("a call of something that is not callable");
    }
  }

  // ('storage', storage type, key, location, numel) -> a 1-D tensor over the record data/<key>.
  // ('storage', storage type, key, location, numel) in the zip format; the legacy format adds a view (None).
  c10::IValue persistent(const Item& id) {
    if (!id.value.isTuple() || id.value.toTupleRef().elements().size() < 5) fail("an unknown persistent id");
    const auto& elements = id.value.toTupleRef().elements();
    if (elements.size() > 5 && !elements[5].isNone())
      fail("a storage view (legacy format); re-save the file with a current PyTorch");
    if (!elements[0].isString() || elements[0].toStringRef() != "storage" || !elements[2].isString() ||
        !elements[4].isInt())
      fail("an unknown persistent id");
    const std::string& record = elements[2].toStringRef();
    const auto cached = storages_.find(record);
    if (cached != storages_.end()) return cached->second;
    // The storage type's GLOBAL item carries its dtype as an integer.
    if (!elements[1].isInt()) fail("a storage of unknown type");
    const auto dtype = static_cast<at::ScalarType>(elements[1].toInt());
    const std::int64_t numel = elements[4].toInt();
    const size_t item_size = c10::elementSize(dtype);
    at::Tensor storage;
    if (numel < 0) fail("a storage of negative size");
    if (numel == 0 || !zip_) {
      storage = at::empty({numel}, at::TensorOptions().dtype(dtype));  // legacy: filled after the pickles
    } else {
      auto [data, bytes] = zip_->getRecord("data/" + record);
      if (bytes != static_cast<size_t>(numel) * item_size)
        fail(fmt::format("storage {} holds {} bytes, not {} elements of {}", record, bytes, numel,
                         c10::toString(dtype)));
      c10::Storage raw(c10::Storage::use_byte_size_t(), bytes, std::move(data), nullptr, false);
      storage = at::empty({0}, at::TensorOptions().dtype(dtype)).set_(raw, 0, {numel}, {1});
    }
    storages_.emplace(record, storage);
    return storage;
  }

  const std::string& path_;
  const std::uint8_t* data_;
  size_t size_;
  size_t position_ = 0;
  caffe2::serialize::PyTorchStreamReader* zip_;  // null for the legacy format
  std::vector<Item> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<std::uint32_t, Item> memo_;
  std::unordered_map<std::string, at::Tensor> storages_;
};

std::string read_whole_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (!file.good() && !file.eof())
    throw std::invalid_argument(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
  return bytes;
}

}  // namespace

bool is_torch_save_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  char magic[4] = {};
  if (!file.read(magic, sizeof(magic))) return false;
  return std::memcmp(magic, "PK\x03\x04", 4) == 0 || std::memcmp(magic, "\x80\x02\x8a\x0a", 4) == 0;
}

c10::IValue read_pytorch_file(const std::string& path) {
  std::ifstream probe(path, std::ios::binary);
  if (!probe) throw std::invalid_argument(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  unsigned char magic[4] = {};
  probe.read(reinterpret_cast<char*>(magic), sizeof(magic));
  if (std::memcmp(magic, "\x80\x02\x8a\x0a", 4) == 0) {
    // The legacy format (before PyTorch 1.6): pickles of the magic number, the protocol version and the
    // system info, then the object, then its storage keys, then the storages' bytes.
    // The magic number 0x1950a86a20f9469cfc6c is wider than 64 bits: its pickle is compared as bytes.
    static const char kMagicPickle[] = "\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.";
    const std::string bytes = read_whole_file(path);
    const size_t magic_size = sizeof(kMagicPickle) - 1;
    if (bytes.size() < magic_size || bytes.compare(0, magic_size, kMagicPickle, magic_size) != 0)
      throw std::invalid_argument(
          fmt::format("{}: not a torch.save file (a pickle without PyTorch's magic number)", path));
    Unpickler unpickler(path, reinterpret_cast<const std::uint8_t*>(bytes.data()) + magic_size,
                        bytes.size() - magic_size, nullptr);
    const c10::IValue version = unpickler.run();
    if (!version.isInt() || version.toInt() != 1001)
      throw std::invalid_argument(fmt::format("{}: an unknown legacy torch.save protocol version", path));
    unpickler.run();  // system info
    c10::IValue result = unpickler.run();
    unpickler.fill_legacy_storages(unpickler.run());
    return result;
  }
  if (std::memcmp(magic, "PK\x03\x04", 4) != 0)
    throw std::invalid_argument(fmt::format("{}: not a torch.save file (no zip archive)", path));
  try {
    caffe2::serialize::PyTorchStreamReader zip(path);
    auto [pickle, size] = zip.getRecord("data.pkl");
    Unpickler unpickler(path, static_cast<const std::uint8_t*>(pickle.get()), size, &zip);
    return unpickler.run();
  } catch (const c10::Error& error) {
    throw std::invalid_argument(
        fmt::format("{}: cannot read this torch.save file: {}", path, first_line(error.what_without_backtrace())));
  }
}

}  // namespace runner::ckpt
