// Bindings of kiln/refit.h: Refitter.
//
// set_weight takes any CPU array (numpy, or a torch tensor through DLPack, bf16 included);
// set_weight_ptr takes a host address with its dtype and shape, the cheap path for the torch
// front end (kiln/refit.py), which hands over contiguous CPU tensors it keeps alive for the
// call. The data is copied before the call returns; set_weight_view skips that copy (the caller
// keeps the tensors alive and unchanged until refit(), as kiln/refit.py does). refit() releases
// the GIL: it evaluates the refit program and rewrites the engine's constants, which may take a
// while on big models.
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "kiln/errors.h"
#include "kiln/refit.h"
#include "src/python/bindings.h"

namespace kiln::python {

namespace {

using HostArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

void set_weight_array(Refitter& r, const std::string& name, const HostArray& a) {
  std::vector<int64_t> shape(a.shape_ptr(), a.shape_ptr() + a.ndim());
  TensorType t(dtype_from_dlpack(a.dtype(), "weight '" + name + "'"), shape);
  r.set_weight(name, t, a.data());
}

void set_weight_ptr(Refitter& r, const std::string& name, DType dtype, nb::handle shape, nb::handle address) {
  TensorType t(dtype, shape_from_sequence(shape, "shape"));
  r.set_weight(name, t, t.nbytes() ? pointer_from_int(address, "address") : nullptr);
}

void set_weight_view(Refitter& r, const std::string& name, DType dtype, nb::handle shape, nb::handle address) {
  TensorType t(dtype, shape_from_sequence(shape, "shape"));
  r.set_weight_view(name, t, t.nbytes() ? pointer_from_int(address, "address") : nullptr);
}

}  // namespace

void bind_refit(nb::module_& m) {
  nb::class_<Refitter>(m, "Refitter",
                       "Replaces a refittable engine's weights by name without rebuilding it; contexts already "
                       "created see the new weights.")
      .def(nb::init<std::shared_ptr<Engine>>(), nb::arg("engine"),
           "Raises UnsupportedError for an engine built with immutable weights.")
      .def_prop_ro("engine", &Refitter::engine)
      .def_prop_ro("weight_names", &Refitter::weight_names,
                   "Every weight the engine takes: plan weights and the inputs of its refit program.")
      .def("weight_type", &Refitter::weight_type, nb::arg("name"),
           "The type a weight must have; InvalidArgumentError for a name the engine lacks.")
      .def("set_weight", &set_weight_array, nb::arg("name"), nb::arg("array"),
           "A new value (a CPU array: numpy or DLPack); InvalidArgumentError naming the weight when its name, "
           "shape or dtype is wrong.")
      .def("set_weight_ptr", &set_weight_ptr, nb::arg("name"), nb::arg("dtype"), nb::arg("shape"),
           nb::arg("address"),
           nb::sig("def set_weight_ptr(self, name: str, dtype: DType, shape: collections.abc.Sequence[int], "
                   "address: int) -> None"),
           "A new value from a dense host buffer at `address`, copied before returning.")
      .def("set_weight_view", &set_weight_view, nb::arg("name"), nb::arg("dtype"), nb::arg("shape"),
           nb::arg("address"),
           nb::sig("def set_weight_view(self, name: str, dtype: DType, shape: collections.abc.Sequence[int], "
                   "address: int) -> None"),
           "Like set_weight_ptr without the copy: the buffer must stay alive and unchanged until refit().")
      .def("missing_weights", &Refitter::missing_weights,
           "Weights that must still be given before refit(): derived constants need all of their sources.")
      .def("refit", &Refitter::refit, nb::call_guard<nb::gil_scoped_release>(),
           "Applies the weights given since the last refit (InvalidArgumentError naming missing ones).")
      .def_prop_ro("report", &Refitter::report,
                   "What the last refit() did and the milliseconds of each part; empty before the first.");
}

}  // namespace kiln::python
