// Bindings of kiln/size_program.h: SizeProgram.fit over (binding, plan) samples and evaluate.
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "kiln/size_program.h"
#include "src/python/bindings.h"

namespace kiln::python {

void bind_size_program(nb::module_& m) {
  nb::class_<SizeProgram>(m, "SizeProgram",
                          "A plan's sizes as multilinear functions of shape symbols, fitted from plans optimized at "
                          "sample bindings (kiln/size_program.h).")
      .def_static(
          "fit",
          [](const std::vector<std::pair<SymbolBinding, Graph>>& samples) {
            std::vector<SizeSample> s;
            for (const auto& [binding, plan] : samples) s.push_back({binding, plan});
            nb::gil_scoped_release release;
            return SizeProgram::fit(s);
          },
          nb::arg("samples"),
          "Fits from [(binding, plan)]: the first 2**n samples are a grid's corners (symbol i at its second "
          "value where bit i of the index is set), the rest check the fit. Raises UnsupportedError naming the "
          "first difference that is not a fitted integer.")
      .def(
          "evaluate",
          [](const SizeProgram& p, const Graph& base, const SymbolBinding& binding) {
            nb::gil_scoped_release release;
            return p.evaluate(base, binding);
          },
          nb::arg("base"), nb::arg("binding"),
          "A copy of ``base`` (a plan equal to the first sample's) with the fitted sizes at ``binding``, verified.")
      .def_prop_ro("symbols", &SizeProgram::symbols)
      .def_prop_ro("fitted", &SizeProgram::fitted, "How many integers of the plan depend on the symbols.")
      .def("__str__", &SizeProgram::to_string);
}

}  // namespace kiln::python
