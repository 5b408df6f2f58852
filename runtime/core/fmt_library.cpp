// fmt's compiled part, built once. runner uses the fmt of LibTorch's include directory without FMT_HEADER_ONLY: each
// file instantiates only the calls it makes, and the formatting engine (vformat_to, the floating-point algorithms,
// the locale helpers) is compiled here alone, as fmt's own src/format.cc compiles it, instead of in every file.
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE

#if FMT_USE_LOCALE
template FMT_API locale_ref::locale_ref(const std::locale& loc);
template FMT_API auto locale_ref::get<std::locale>() const -> std::locale;
#endif

namespace detail {

template FMT_API auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template FMT_API auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;
template FMT_API auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template FMT_API auto decimal_point_impl(locale_ref) -> char;
template FMT_API void buffer<char>::append(const char*, const char*);

}  // namespace detail

FMT_END_NAMESPACE
