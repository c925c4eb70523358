// Declarations shared by the binding files of kiln._C. One binding file per core header
// (ir.cpp <-> kiln/ir.h, builder.cpp <-> kiln/builder.h, ...); module.cpp creates the module,
// the exception classes and calls each bind_* in dependency order.
//
// The bindings stay thin: they convert Python values to the C++ types and back and hold
// no semantics of their own. Every failure is raised as a kiln::Error so that it reaches
// Python as the matching kiln exception class (see module.cpp for the mapping).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/ir.h"

namespace kiln::python {

namespace nb = nanobind;

void bind_dtype(nb::module_& m);    // dtype.cpp: DType, numpy conversions
void bind_ir(nb::module_& m);       // ir.cpp: op list, Dim, TensorType, Value, Node, Graph
void bind_builder(nb::module_& m);  // builder.cpp: BuilderConfig, Builder
void bind_size_program(nb::module_& m);  // size_program.cpp: SizeProgram
void bind_engine(nb::module_& m);   // engine.cpp: IOTensor, Engine, ExecutionContext
void bind_import(nb::module_& m);   // import.cpp: Import* structures, can_import, import_aten
void bind_refit(nb::module_& m);    // refit.cpp: Refitter
void bind_bundle(nb::module_& m);   // bundle.cpp: write_bundle, Bundle, BundleContext

// numpy dtype (anything numpy.dtype() accepts) -> DType; throws kUnsupported for a dtype
// Kiln has no equivalent of.
DType dtype_from_numpy(nb::handle dtype_like);
// DType -> numpy.dtype; throws kUnsupported for bf16 (numpy has none).
nb::object dtype_to_numpy(DType t);
// DLPack element type <-> DType; `what` names the tensor in the kUnsupported error.
DType dtype_from_dlpack(nb::dlpack::dtype d, const std::string& what);
nb::dlpack::dtype dlpack_of(DType t);

// A Python int holding an address (a tensor's data_ptr(), a stream handle) -> pointer.
void* pointer_from_int(nb::handle h, const char* what);

// Shape as a list of Python ints -> int64 vector, rejecting non-integers by name.
std::vector<int64_t> shape_from_sequence(nb::handle seq, const char* what);

// A readable view of any object exporting the buffer protocol (bytes, bytearray, numpy, ...).
// Released when the view goes out of scope.
class BufferView {
 public:
  BufferView(nb::handle obj, const char* what);
  ~BufferView();
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

}  // namespace kiln::python
