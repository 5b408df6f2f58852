// Tensor pretty printer: a port of torch/_tensor_str.py (torch 2.11) with Lua spellings in the suffixes.
#include "runtime/core/tensor_format.h"

#include <ATen/ATen.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <utility>
#include <vector>

namespace runner::core {
namespace {

// The name Python's str(dtype) prints, without the "torch." prefix.
std::string dtype_text(c10::ScalarType type) {
  using c10::ScalarType;
  switch (type) {
    case ScalarType::Byte:
      return "uint8";
    case ScalarType::Char:
      return "int8";
    case ScalarType::Short:
      return "int16";
    case ScalarType::Int:
      return "int32";
    case ScalarType::Long:
      return "int64";
    case ScalarType::UInt16:
      return "uint16";
    case ScalarType::UInt32:
      return "uint32";
    case ScalarType::UInt64:
      return "uint64";
    case ScalarType::Half:
      return "float16";
    case ScalarType::Float:
      return "float32";
    case ScalarType::Double:
      return "float64";
    case ScalarType::BFloat16:
      return "bfloat16";
    case ScalarType::Bool:
      return "bool";
    case ScalarType::ComplexHalf:
      return "complex32";
    case ScalarType::ComplexFloat:
      return "complex64";
    case ScalarType::ComplexDouble:
      return "complex128";
    case ScalarType::QInt8:
      return "qint8";
    case ScalarType::QUInt8:
      return "quint8";
    case ScalarType::QInt32:
      return "qint32";
    case ScalarType::QUInt4x2:
      return "quint4x2";
    case ScalarType::QUInt2x4:
      return "quint2x4";
    case ScalarType::Float8_e5m2:
      return "float8_e5m2";
    case ScalarType::Float8_e4m3fn:
      return "float8_e4m3fn";
    case ScalarType::Float8_e5m2fnuz:
      return "float8_e5m2fnuz";
    case ScalarType::Float8_e4m3fnuz:
      return "float8_e4m3fnuz";
    case ScalarType::Float8_e8m0fnu:
      return "float8_e8m0fnu";
    case ScalarType::Float4_e2m1fn_x2:
      return "float4_e2m1fn_x2";
    default:
      return c10::toString(type);
  }
}

std::string layout_text(c10::Layout layout) {
  switch (layout) {
    case c10::kStrided:
      return "torch.strided";
    case c10::kSparse:
      return "torch.sparse_coo";
    case c10::kSparseCsr:
      return "torch.sparse_csr";
    case c10::kSparseCsc:
      return "torch.sparse_csc";
    case c10::kSparseBsr:
      return "torch.sparse_bsr";
    case c10::kSparseBsc:
      return "torch.sparse_bsc";
    case c10::kMkldnn:
      return "torch._mkldnn";
    case c10::kJagged:
      return "torch.jagged";
    default:
      return "torch." + c10::str(layout);
  }
}

// Python's str(tuple(shape)): "()", "(3,)", "(0, 3)".
std::string shape_tuple_text(at::IntArrayRef sizes) {
  std::string text = "(";
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(sizes[i]);
  }
  if (sizes.size() == 1) text += ",";
  return text + ")";
}

std::string printf_number(const char* format, int precision, double value) {
  const int length = std::snprintf(nullptr, 0, format, precision, value);
  std::string text(static_cast<std::size_t>(length), '\0');
  std::snprintf(text.data(), text.size() + 1, format, precision, value);
  return text;
}

// Python's "{:.Nf}" and "{:.Ne}": like printf, but a NaN never carries a sign.
std::string nonfinite_text(double value) {
  if (std::isnan(value)) return "nan";
  return value > 0 ? "inf" : "-inf";
}

std::string fixed_text(double value, int precision) {
  return std::isfinite(value) ? printf_number("%.*f", precision, value) : nonfinite_text(value);
}

std::string scientific_text(double value, int precision) {
  return std::isfinite(value) ? printf_number("%.*e", precision, value) : nonfinite_text(value);
}

// Python's repr(float): the shortest round-trip digits, positional for exponents in [-4, 16).
std::string python_float_repr(double value) {
  if (!std::isfinite(value)) return nonfinite_text(value);
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  const std::string scientific(buffer, result.ptr);
  const std::size_t e_pos = scientific.find('e');
  const int exponent = std::stoi(scientific.substr(e_pos + 1));
  if (exponent < -4 || exponent >= 16) return scientific;
  std::string mantissa = scientific.substr(0, e_pos);
  const bool negative = mantissa.front() == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string text;
  if (exponent < 0) {
    text = "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
  } else {
    const auto integer_digits = static_cast<std::size_t>(exponent + 1);
    if (digits.size() <= integer_digits)
      text = digits + std::string(integer_digits - digits.size(), '0') + ".0";
    else
      text = digits.substr(0, integer_digits) + "." + digits.substr(integer_digits);
  }
  return negative ? "-" + text : text;
}

// The elements to print, as a contiguous CPU tensor of double (floating dtypes), int64, uint64 or bool.
class ElementTable {
 public:
  explicit ElementTable(const at::Tensor& t) {
    const c10::ScalarType type = t.scalar_type();
    floating_ = c10::isFloatingType(type);
    at::Tensor cpu = t.cpu();
    if (type == c10::ScalarType::Float4_e2m1fn_x2)  // printed from its bytes, as Python does
      values_ = cpu.view(c10::kByte).to(c10::kDouble);
    else if (floating_)
      values_ = cpu.to(c10::kDouble);
    else if (type == c10::kBool || type == c10::ScalarType::UInt64)
      values_ = cpu;
    else if (c10::isIntegralType(type, /*includeBool=*/false))
      values_ = cpu.to(c10::kLong);
    else
      throw std::invalid_argument("format_tensor: dtype " + dtype_text(type) + " not supported");
    values_ = values_.contiguous();
  }

  bool floating() const { return floating_; }
  std::int64_t size() const { return values_.numel(); }
  double number(std::int64_t offset) const { return values_.const_data_ptr<double>()[offset]; }

  // Python's str() of a non-floating element, with Lua's true/false.
  std::string text(std::int64_t offset) const {
    switch (values_.scalar_type()) {
      case c10::kBool:
        return values_.const_data_ptr<bool>()[offset] ? "true" : "false";
      case c10::ScalarType::UInt64:
        return std::to_string(values_.const_data_ptr<std::uint64_t>()[offset]);
      default:
        return std::to_string(values_.const_data_ptr<std::int64_t>()[offset]);
    }
  }

 private:
  at::Tensor values_;
  bool floating_ = false;
};

// torch._tensor_str._Formatter: one width and one number style for all the elements shown.
class ElementFormatter {
 public:
  ElementFormatter(const ElementTable& table, int precision) : table_(table), precision_(precision) {
    if (!table.floating()) {
      for (std::int64_t i = 0; i < table.size(); ++i) max_width_ = std::max(max_width_, table.text(i).size());
      return;
    }
    std::vector<double> nonzero_finite;
    for (std::int64_t i = 0; i < table.size(); ++i) {
      const double value = table.number(i);
      if (std::isfinite(value) && value != 0) nonzero_finite.push_back(value);
    }
    if (nonzero_finite.empty()) return;

    double min_abs = std::abs(nonzero_finite.front());
    double max_abs = min_abs;
    for (double value : nonzero_finite) {
      if (value != std::ceil(value)) int_mode_ = false;
      min_abs = std::min(min_abs, std::abs(value));
      max_abs = std::max(max_abs, std::abs(value));
    }
    sci_mode_ = max_abs / min_abs > 1000.0 || max_abs > 1.0e8 || min_abs < 1.0e-4;

    for (double value : nonzero_finite) {
      std::size_t width = 0;
      if (sci_mode_)
        width = scientific_text(value, precision_).size();
      else if (int_mode_)
        width = fixed_text(value, 0).size() + 1;  // room for the trailing "."
      else
        width = fixed_text(value, precision_).size();
      max_width_ = std::max(max_width_, width);
    }
  }

  std::size_t width() const { return max_width_; }

  std::string format(std::int64_t offset) const {
    std::string text;
    if (!table_.floating()) {
      text = table_.text(offset);
    } else {
      const double value = table_.number(offset);
      if (sci_mode_) {
        text = scientific_text(value, precision_);
      } else if (int_mode_) {
        text = fixed_text(value, 0);
        if (std::isfinite(value)) text += ".";
      } else {
        text = fixed_text(value, precision_);
      }
    }
    if (text.size() < max_width_) text.insert(0, max_width_ - text.size(), ' ');
    return text;
  }

 private:
  const ElementTable& table_;
  int precision_;
  bool int_mode_ = true;
  bool sci_mode_ = false;
  std::size_t max_width_ = 1;
};

// Lays out the elements of a (possibly summarized) tensor in nested brackets.
class ElementLayout {
 public:
  ElementLayout(const ElementFormatter& formatter, std::vector<std::int64_t> sizes, std::vector<bool> gapped,
                std::int64_t edgeitems, int linewidth)
      : formatter_(formatter),
        sizes_(std::move(sizes)),
        gapped_(std::move(gapped)),
        strides_(sizes_.size(), 1),
        edgeitems_(edgeitems),
        linewidth_(linewidth) {
    for (std::size_t d = sizes_.size(); d-- > 1;) strides_[d - 1] = strides_[d] * sizes_[d];
  }

  std::string render(std::size_t dim, std::int64_t offset, int indent) const {
    const std::size_t remaining = sizes_.size() - dim;
    if (remaining == 0) return formatter_.format(offset);
    const std::vector<std::int64_t> indices = shown_indices(dim);

    if (remaining == 1) {
      const auto element_length = static_cast<double>(formatter_.width() + 2);
      const auto per_line =
          std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor((linewidth_ - indent) / element_length)));
      std::string text = "[";
      for (std::size_t i = 0; i < indices.size(); ++i) {
        if (i > 0) text += static_cast<std::int64_t>(i) % per_line == 0 ? ",\n" + std::string(indent + 1, ' ') : ", ";
        text += indices[i] < 0 ? " ..." : formatter_.format(offset + indices[i] * strides_[dim]);
      }
      return text + "]";
    }

    const std::string separator = "," + std::string(remaining - 1, '\n') + std::string(indent + 1, ' ');
    std::string text = "[";
    for (std::size_t i = 0; i < indices.size(); ++i) {
      if (i > 0) text += separator;
      text += indices[i] < 0 ? "..." : render(dim + 1, offset + indices[i] * strides_[dim], indent + 1);
    }
    return text + "]";
  }

 private:
  // Indices into the table along dim; -1 marks the "..." between the two edges of a summarized dim.
  std::vector<std::int64_t> shown_indices(std::size_t dim) const {
    std::vector<std::int64_t> indices;
    for (std::int64_t i = 0; i < sizes_[dim]; ++i) {
      if (gapped_[dim] && i == edgeitems_) indices.push_back(-1);
      indices.push_back(i);
    }
    return indices;
  }

  const ElementFormatter& formatter_;
  std::vector<std::int64_t> sizes_;
  std::vector<bool> gapped_;
  std::vector<std::int64_t> strides_;
  std::int64_t edgeitems_;
  int linewidth_;
};

// A repr, or a part of one, and how many characters longer Python's spelling of it is: lines break
// where Python's do, though Lua's dtype=float64 is shorter than Python's dtype=torch.float64.
struct ReprText {
  std::string text;
  std::size_t python_extra = 0;
};

constexpr std::size_t kTorchPrefixLength = 6;  // "torch."

class TensorPrinter {
 public:
  explicit TensorPrinter(const TensorFormatOptions& options) : options_(options) {}

  // torch._tensor_str._str_intern.
  ReprText repr(const at::Tensor& input) const {
    if (!input.defined()) return {"tensor(undefined)"};
    const c10::ScalarType type = input.scalar_type();
    if (c10::isComplexType(type)) throw std::invalid_argument("format_tensor: complex dtype not supported");
    c10::NoGradGuard no_grad;
    const at::Tensor& self = input;

    const std::string prefix = self.is_nested() ? "nested_tensor(" : "tensor(";
    const int indent = static_cast<int>(prefix.size());
    std::vector<ReprText> suffixes;
    ReprText body;

    if (self.device().type() != c10::DeviceType::CPU) suffixes.push_back({"device='" + self.device().str() + "'"});

    const c10::ScalarType default_dtype = c10::get_default_dtype_as_scalartype();
    const bool has_default_dtype = type == default_dtype || type == c10::kLong || type == c10::kBool;
    const ReprText dtype_suffix{"dtype=" + dtype_text(type), kTorchPrefixLength};
    const auto size_suffix = [&self] { return ReprText{"size=" + shape_tuple_text(self.sizes())}; };
    const c10::Layout layout = self.layout();

    if (layout == c10::kSparse) {
      suffixes.push_back(size_suffix());
      if (!self.is_meta()) suffixes.push_back({"nnz=" + std::to_string(self._nnz())});
      if (!has_default_dtype) suffixes.push_back(dtype_suffix);
      body.text = part("indices=tensor(", self._indices(), indent) + "),\n" + std::string(indent, ' ') +
                  part("values=tensor(", self._values(), indent) + ")";
    } else if (layout == c10::kSparseCsr || layout == c10::kSparseCsc || layout == c10::kSparseBsr ||
               layout == c10::kSparseBsc) {
      suffixes.push_back(size_suffix());
      if (!self.is_meta()) suffixes.push_back({"nnz=" + std::to_string(self._nnz())});
      if (!has_default_dtype) suffixes.push_back(dtype_suffix);
      const bool row_compressed = layout == c10::kSparseCsr || layout == c10::kSparseBsr;
      const std::string newline = "),\n" + std::string(indent, ' ');
      body.text = row_compressed ? part("crow_indices=tensor(", self.crow_indices(), indent) + newline +
                                       part("col_indices=tensor(", self.col_indices(), indent)
                                 : part("ccol_indices=tensor(", self.ccol_indices(), indent) + newline +
                                       part("row_indices=tensor(", self.row_indices(), indent);
      body.text += newline + part("values=tensor(", self.values(), indent) + ")";
    } else if (self.is_quantized()) {
      suffixes.push_back(size_suffix());
      if (!has_default_dtype) suffixes.push_back(dtype_suffix);
      const c10::QScheme scheme = self.qscheme();
      suffixes.push_back({"quantization_scheme=torch." + c10::toString(scheme)});
      if (scheme == c10::kPerTensorAffine || scheme == c10::kPerTensorSymmetric) {
        suffixes.push_back({"scale=" + python_float_repr(self.q_scale())});
        suffixes.push_back({"zero_point=" + std::to_string(self.q_zero_point())});
      } else if (scheme == c10::kPerChannelAffine || scheme == c10::kPerChannelSymmetric ||
                 scheme == c10::kPerChannelAffineFloatQParams) {
        suffixes.push_back(labelled("scale=", repr(self.q_per_channel_scales())));
        suffixes.push_back(labelled("zero_point=", repr(self.q_per_channel_zero_points())));
        suffixes.push_back({"axis=" + std::to_string(self.q_per_channel_axis())});
      }
      body.text = contents(self.dequantize(), indent);
    } else if (self.is_nested()) {
      body.text = "[\n";
      const std::vector<at::Tensor> components = self.unbind(0);
      for (std::size_t i = 0; i < components.size(); ++i) {
        const ReprText component = repr(components[i]);
        if (i > 0) body.text += ",\n";
        body.text += indented(component.text);
        body.python_extra += component.python_extra;
      }
      body.text += "\n]";
    } else if (self.is_meta()) {
      suffixes.push_back(size_suffix());
      if (type != default_dtype) suffixes.push_back(dtype_suffix);
      body.text = "...";
    } else if (self.numel() == 0) {
      if (self.dim() != 1) suffixes.push_back(size_suffix());
      if (type != default_dtype) suffixes.push_back(dtype_suffix);  // no element says what it is
      body.text = "[]";
    } else {
      if (options_.edgeitems == 0) suffixes.push_back(size_suffix());
      if (!has_default_dtype) suffixes.push_back(dtype_suffix);
      body.text = contents(layout == c10::kStrided ? self : self.to_dense(), indent);
    }

    if (layout != c10::kStrided) suffixes.push_back({"layout=" + layout_text(layout)});

    std::string grad_fn_name;
    try {
      if (const auto& grad_fn = input.grad_fn()) {
        grad_fn_name = grad_fn->name();
        const std::size_t scope = grad_fn_name.rfind("::");
        if (scope != std::string::npos) grad_fn_name.erase(0, scope + 2);
      }
    } catch (const c10::Error&) {
      grad_fn_name = "Invalid";  // an in-place-modified no-grad view refuses to give its grad_fn
    }
    if (!grad_fn_name.empty())
      suffixes.push_back({"grad_fn=<" + grad_fn_name + ">"});
    else if (input.requires_grad())
      suffixes.push_back({"requires_grad=true"});

    if (self.has_names()) suffixes.push_back({"names=" + names_text(self.names())});

    body.text.insert(0, prefix);
    return add_suffixes(std::move(body), suffixes, indent, layout == c10::kSparse);
  }

 private:
  // torch._tensor_str._tensor_str: the bracketed elements, without prefix or suffixes.
  std::string contents(at::Tensor t, int indent) const {
    if (t.numel() == 0) return "[]";
    if (t.has_names()) t = t.rename(std::nullopt);
    if (t._is_zerotensor()) t = t.clone();
    const bool summarize = t.numel() > options_.threshold;
    const std::int64_t edgeitems = options_.edgeitems;
    if (summarize && edgeitems == 0 && t.dim() > 0) return "[...]";

    // Keep only the edges of summarized dims (torch's get_summarized_data, with the shape kept) so
    // that a large tensor is neither copied to the CPU nor converted whole.
    std::vector<bool> gapped(static_cast<std::size_t>(t.dim()), false);
    for (std::int64_t d = 0; summarize && d < t.dim(); ++d) {
      const std::int64_t size = t.size(d);
      if (size <= 2 * edgeitems) continue;
      t = at::cat({t.narrow(d, 0, edgeitems), t.narrow(d, size - edgeitems, edgeitems)}, d);
      gapped[static_cast<std::size_t>(d)] = true;
    }
    t = t.resolve_neg();

    const ElementTable table(t);
    const ElementFormatter formatter(table, options_.precision);
    const ElementLayout layout(formatter, t.sizes().vec(), std::move(gapped), edgeitems, options_.linewidth);
    return layout.render(0, 0, indent);
  }

  // One "name=tensor(...)" part of a sparse tensor's body, still open for the caller to close.
  std::string part(const std::string& part_prefix, const at::Tensor& t, int indent) const {
    if (t.is_meta()) return part_prefix + "..., size=" + shape_tuple_text(t.sizes());
    std::string text = part_prefix + contents(t, indent + static_cast<int>(part_prefix.size()));
    if (t.numel() == 0) text += ", size=" + shape_tuple_text(t.sizes());
    return text;
  }

  // torch._tensor_str._add_suffixes, measuring lengths as Python spells them.
  ReprText add_suffixes(ReprText repr, const std::vector<ReprText>& suffixes, int indent, bool force_newline) const {
    // Python's len(s) - s.rfind("\n") + 1, where rfind gives -1 when there is no newline.
    const std::size_t newline = repr.text.rfind('\n');
    const std::int64_t newline_index = newline == std::string::npos ? -1 : static_cast<std::int64_t>(newline);
    std::int64_t last_line_length = static_cast<std::int64_t>(repr.text.size()) - newline_index + 1;
    for (const ReprText& suffix : suffixes) {
      const auto suffix_length = static_cast<std::int64_t>(suffix.text.size() + suffix.python_extra);
      if (force_newline || last_line_length + suffix_length + 2 > options_.linewidth) {
        repr.text += ",\n" + std::string(indent, ' ') + suffix.text;
        last_line_length = indent + suffix_length;
        force_newline = false;
      } else {
        repr.text += ", " + suffix.text;
        last_line_length += suffix_length + 2;
      }
      repr.python_extra += suffix.python_extra;
    }
    repr.text += ")";
    return repr;
  }

  static ReprText labelled(const std::string& label, ReprText repr) {
    repr.text.insert(0, label);
    return repr;
  }

  static std::string indented(const std::string& text) {
    std::string result = "  ";
    for (char c : text) {
      result += c;
      if (c == '\n') result += "  ";
    }
    return result;
  }

  // Python's str() of tensor.names: "('N', None)", "('N',)".
  static std::string names_text(at::DimnameList names) {
    std::string text = "(";
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (i > 0) text += ", ";
      text += names[i].isWildcard() ? "None" : "'" + std::string(names[i].symbol().toUnqualString()) + "'";
    }
    if (names.size() == 1) text += ",";
    return text + ")";
  }

  TensorFormatOptions options_;
};

}  // namespace

std::string format_tensor(const at::Tensor& t, const TensorFormatOptions& options) {
  if (options.precision < 0) throw std::invalid_argument("format_tensor: precision must not be negative");
  if (options.edgeitems < 0) throw std::invalid_argument("format_tensor: edgeitems must not be negative");
  return TensorPrinter(options).repr(t).text;
}

}  // namespace runner::core
