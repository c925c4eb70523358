// Bindings of kiln/dtype.h: the DType enum, its sizes and names, and the conversions to and
// from numpy dtypes and DLPack element types that the other binding files use.
//
// numpy has no bfloat16: bf16 data reaches Kiln through DLPack (torch tensors) or raw
// addresses, never through a numpy dtype.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include <string_view>

#include "kiln/dtype.h"
#include "kiln/errors.h"
#include "src/python/bindings.h"

namespace kiln::python {

namespace {

struct NumpyName {
  DType t;
  const char* numpy;
};
constexpr NumpyName kNumpyNames[] = {
    {DType::kF32, "float32"}, {DType::kF16, "float16"}, {DType::kF64, "float64"},
    {DType::kI64, "int64"},   {DType::kI32, "int32"},   {DType::kI8, "int8"},
    {DType::kU8, "uint8"},    {DType::kBool, "bool"},
};

constexpr const char* kKilnDTypes = "Kiln has f32, f16, bf16, f64, i64, i32, i8, u8, bool";

}  // namespace

nb::dlpack::dtype dlpack_of(DType t) {
  using C = nb::dlpack::dtype_code;
  auto d = [](C c, int bits) { return nb::dlpack::dtype{uint8_t(c), uint8_t(bits), 1}; };
  switch (t) {
    case DType::kF32: return d(C::Float, 32);
    case DType::kF16: return d(C::Float, 16);
    case DType::kBF16: return d(C::Bfloat, 16);
    case DType::kF64: return d(C::Float, 64);
    case DType::kI64: return d(C::Int, 64);
    case DType::kI32: return d(C::Int, 32);
    case DType::kI8: return d(C::Int, 8);
    case DType::kU8: return d(C::UInt, 8);
    case DType::kBool: return d(C::Bool, 8);
  }
  KILN_FAIL(kInternal, "unknown dtype code ", int(t));
}

DType dtype_from_dlpack(nb::dlpack::dtype d, const std::string& what) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (dlpack_of(DType(i)) == d) return DType(i);
  KILN_FAIL(kUnsupported, what, ": element type (DLPack code ", int(d.code), ", ", int(d.bits),
            " bits) has no Kiln dtype; ", kKilnDTypes);
}

DType dtype_from_numpy(nb::handle dtype_like) {
  nb::object dt = nb::module_::import_("numpy").attr("dtype")(dtype_like);
  std::string name = nb::cast<std::string>(dt.attr("name"));
  for (const auto& r : kNumpyNames)
    if (name == r.numpy) return r.t;
  KILN_FAIL(kUnsupported, "numpy dtype ", name, " has no Kiln dtype; ", kKilnDTypes);
}

nb::object dtype_to_numpy(DType t) {
  for (const auto& r : kNumpyNames)
    if (r.t == t) return nb::module_::import_("numpy").attr("dtype")(r.numpy);
  KILN_FAIL(kUnsupported, "dtype ", dtype_name(t), " has no numpy equivalent (use torch tensors for bf16)");
}

void bind_dtype(nb::module_& m) {
  nb::enum_<DType>(m, "DType", "Element types of Kiln tensors.")
      .value("f32", DType::kF32)
      .value("f16", DType::kF16)
      .value("bf16", DType::kBF16)
      .value("f64", DType::kF64)
      .value("i64", DType::kI64)
      .value("i32", DType::kI32)
      .value("i8", DType::kI8)
      .value("u8", DType::kU8)
      .value("bool", DType::kBool);

  m.def("dtype_size", &dtype_size, nb::arg("dtype"), "Bytes per element.");
  m.def("dtype_from_name", [](std::string_view s) { return dtype_from_name(s); }, nb::arg("name"),
        "'f32', 'f16', ... -> DType; raises InvalidArgumentError naming the valid names.");
  m.def("is_floating", &is_floating, nb::arg("dtype"));
  m.def("is_integral", &is_integral, nb::arg("dtype"));
  m.def("dtype_from_numpy", [](nb::handle d) { return dtype_from_numpy(d); }, nb::arg("dtype"),
        nb::sig("def dtype_from_numpy(dtype: numpy.typing.DTypeLike) -> DType"),
        "Anything numpy.dtype() accepts -> DType; raises UnsupportedError when Kiln has no such dtype.");
  m.def("dtype_to_numpy", [](DType t) { return dtype_to_numpy(t); }, nb::arg("dtype"),
        nb::sig("def dtype_to_numpy(dtype: DType) -> numpy.dtype"),
        "DType -> numpy.dtype; raises UnsupportedError for bf16.");
}

}  // namespace kiln::python
