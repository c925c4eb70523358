// Bindings of kiln/bundle.h: write_bundle, Bundle and BundleContext.
//
// kiln/bundle.py builds the glue from an exported program and calls write_bundle; Bundle and
// BundleContext run a bundle from Python as a C++ program would (tests, checks):
//   run(arrays) -> arrays                 CPU arrays (numpy or DLPack) in, numpy out; types checked
//   BundleContext.execute_ptrs(ins, outs, stream)   raw addresses on the bundle's device
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <tuple>

#include "kiln/bundle.h"
#include "kiln/errors.h"
#include "src/python/bindings.h"

template <>
struct nanobind::detail::is_copy_constructible<kiln::Bundle> : std::false_type {};

namespace kiln::python {

namespace {

using InArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using OutArray = nb::ndarray<nb::numpy, nb::c_contig, nb::device::cpu>;
using RefTuple = std::tuple<int32_t, uint32_t>;

std::optional<Device> device_of(const std::optional<std::string>& device) {
  return device ? std::optional<Device>(Device::parse(*device)) : std::nullopt;
}

// Host bytes of each array, checked against the bundle's inputs (dtype and shape).
std::vector<Bytes> host_inputs(const Bundle& b, const std::vector<InArray>& arrays) {
  KILN_CHECK(arrays.size() == b.inputs().size(), kInvalidArgument, "the bundle takes ", b.inputs().size(),
             " inputs, got ", arrays.size());
  std::vector<Bytes> out;
  for (size_t i = 0; i < arrays.size(); ++i) {
    const IOTensor& want = b.inputs()[i];
    const TensorType got(dtype_from_dlpack(arrays[i].dtype(), "bundle input '" + want.name + "'"),
                         std::vector<int64_t>(arrays[i].shape_ptr(), arrays[i].shape_ptr() + arrays[i].ndim()));
    KILN_CHECK(got.dtype == want.type.dtype && got.shape() == want.type.shape(), kShapeMismatch, "bundle input ", i,
               " '", want.name, "' must be ", want.type.to_string(), ", got ", got.to_string());
    const auto* p = static_cast<const uint8_t*>(arrays[i].data());
    out.emplace_back(p, p + got.nbytes());
  }
  return out;
}

// numpy arrays owning each output's bytes (moved, not copied).
nb::list numpy_outputs(const Bundle& b, std::vector<Bytes> results) {
  nb::list out;
  for (size_t i = 0; i < results.size(); ++i) {
    const IOTensor& io = b.outputs()[i];
    KILN_CHECK(io.type.dtype != DType::kBF16, kUnsupported, "bundle output '", io.name,
               "' is bf16, which numpy cannot hold; use BundleContext.execute_ptrs with torch tensors");
    std::vector<size_t> shape;
    for (int64_t e : io.type.shape()) shape.push_back(size_t(e));
    auto owned = std::make_unique<Bytes>(std::move(results[i]));
    if (owned->empty()) owned->resize(1);  // a valid address for an empty array
    uint8_t* data = owned->data();
    nb::capsule owner(owned.get(), [](void* p) noexcept { delete static_cast<Bytes*>(p); });
    owned.release();  // now owned by the capsule
    out.append(nb::cast(OutArray(data, shape.size(), shape.data(), owner, nullptr, dlpack_of(io.type.dtype))));
  }
  return out;
}

nb::list run_arrays(BundleContext& ctx, const std::vector<InArray>& arrays) {
  std::vector<Bytes> in = host_inputs(ctx.bundle(), arrays);
  std::vector<Bytes> results;
  {
    nb::gil_scoped_release release;
    results = ctx.run(in);
  }
  return numpy_outputs(ctx.bundle(), std::move(results));
}

std::vector<void*> addresses(const std::vector<nb::handle>& items, const char* what) {
  std::vector<void*> out;
  for (nb::handle h : items) out.push_back(pointer_from_int(h, what));
  return out;
}

nb::typed<nb::list, IOTensor> io_list(const std::vector<IOTensor>& v) {
  nb::typed<nb::list, IOTensor> out{nb::list()};
  for (const auto& io : v) out.append(nb::cast(io));
  return out;
}

BundleRef ref_of(const RefTuple& t) { return {std::get<0>(t), std::get<1>(t)}; }

TensorType tensor_type(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  for (int64_t e : shape) KILN_CHECK(e >= 0, kInvalidArgument, "bundle tensor '", name, "' has the extent ", e);
  return TensorType(dtype, shape);
}

using SymbolDim = std::tuple<uint32_t, uint32_t, std::string, int64_t, int64_t>;  // tensor, dim, symbol, min, max
using RangeTuple = std::tuple<uint32_t, SymbolBinding, const SizeProgram*, SymbolBinding>;

// Marks dims of the program's inputs or outputs as symbols with their ranges.
void mark_symbols(std::vector<IOTensor>& tensors, const std::vector<SymbolDim>& dims, const char* what) {
  for (const auto& [i, d, symbol, lo, hi] : dims) {
    KILN_CHECK(i < tensors.size() && d < tensors[i].type.dims.size(), kInvalidArgument, "write_bundle: ", what, " ", i,
               " has no dim ", d);
    Dim& dim = tensors[i].type.dims[d];
    KILN_CHECK(!symbol.empty() && lo >= 0 && lo <= dim.extent && dim.extent <= hi, kInvalidArgument,
               "write_bundle: ", what, " ", i, " dim ", d, ": ", dim.extent, " is not in the range [", lo, ", ", hi,
               "] of '", symbol, "'");
    dim.symbol = symbol, dim.min = lo, dim.max = hi;
  }
}

nb::bytes write(const std::vector<nb::handle>& engines,
                const std::vector<std::tuple<std::string, DType, std::vector<int64_t>>>& inputs,
                const std::vector<std::tuple<std::string, uint32_t, std::vector<RefTuple>>>& steps,
                const std::vector<std::tuple<std::string, RefTuple, DType, std::vector<int64_t>>>& outputs,
                const std::vector<SymbolDim>& input_symbols, const std::vector<SymbolDim>& output_symbols,
                const std::vector<RangeTuple>& ranges) {
  std::vector<std::unique_ptr<BufferView>> views;
  std::vector<std::span<const uint8_t>> files;
  for (nb::handle e : engines) {
    views.push_back(std::make_unique<BufferView>(e, "write_bundle engine"));
    files.emplace_back(views.back()->data(), views.back()->size());
  }
  BundleProgram p;
  for (const auto& [name, dtype, shape] : inputs) p.inputs.push_back({name, tensor_type(name, dtype, shape)});
  for (const auto& [name, engine, args] : steps) {
    BundleStep s{name, engine, {}};
    for (const RefTuple& a : args) s.args.push_back(ref_of(a));
    p.steps.push_back(std::move(s));
  }
  for (const auto& [name, ref, dtype, shape] : outputs)
    p.outputs.push_back({name, ref_of(ref), tensor_type(name, dtype, shape)});
  mark_symbols(p.inputs, input_symbols, "input");
  std::vector<IOTensor> outs;
  for (const BundleOutput& o : p.outputs) outs.push_back({o.name, o.type});
  mark_symbols(outs, output_symbols, "output");
  for (size_t i = 0; i < outs.size(); ++i) p.outputs[i].type = outs[i].type;
  for (const auto& [engine, built_at, program, pinned] : ranges) {
    KILN_CHECK(program != nullptr, kInvalidArgument, "write_bundle: a range without a size program");
    p.ranges.push_back({engine, built_at, *program, pinned});
  }
  Bytes bytes;
  {
    nb::gil_scoped_release release;
    bytes = write_bundle(files, p);
  }
  return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace

void bind_bundle(nb::module_& m) {
  m.def(
      "write_bundle", &write, nb::arg("engines"), nb::arg("inputs"), nb::arg("steps"), nb::arg("outputs"),
      nb::arg("input_symbols") = std::vector<SymbolDim>{}, nb::arg("output_symbols") = std::vector<SymbolDim>{},
      nb::arg("ranges") = std::vector<RangeTuple>{},
      nb::sig("def write_bundle(engines: Sequence[bytes | bytearray | memoryview | numpy.ndarray], "
              "inputs: Sequence[tuple[str, DType, Sequence[int]]], "
              "steps: Sequence[tuple[str, int, Sequence[tuple[int, int]]]], "
              "outputs: Sequence[tuple[str, tuple[int, int], DType, Sequence[int]]], "
              "input_symbols: Sequence[tuple[int, int, str, int, int]] = [], "
              "output_symbols: Sequence[tuple[int, int, str, int, int]] = [], "
              "ranges: Sequence[tuple[int, Mapping[str, int], SizeProgram, Mapping[str, int]]] = []) -> bytes"),
      "The bytes of a Kiln bundle: engine files, the program's inputs (name, dtype, shape), its steps (name, "
      "engine index, arguments) and outputs (name, value, dtype, shape). A value is (-1, i): program input i, or (s, "
      "k): output k of step s. A dynamic program also gives the symbolic dims of its inputs and outputs (tensor, dim, "
      "symbol, min, max; the shapes hold the compiled extents) and the ranges of its engines (engine, the binding "
      "it was built at, its SizeProgram, the symbols its plan holds). Raises InvalidArgumentError naming what does "
      "not fit the engines.");

  nb::class_<Bundle>(m, "Bundle", "A Kiln bundle: engines and the glue that calls them (kiln/bundle.h).")
      .def_static(
          "load",
          [](const std::filesystem::path& p, const std::optional<std::string>& device) {
            const std::optional<Device> d = device_of(device);
            nb::gil_scoped_release release;
            return Bundle::load(p.string(), d);
          },
          nb::arg("path"), nb::arg("device").none() = nb::none(),
          "Loads a bundle file on `device` (None: the device kind its engines were built for, device 0); raises an "
          "EngineFileError subclass naming the problem.")
      .def_static(
          "deserialize",
          [](nb::handle data, const std::optional<std::string>& device) {
            BufferView view(data, "Bundle.deserialize data");
            const std::optional<Device> d = device_of(device);
            nb::gil_scoped_release release;
            return Bundle::deserialize(view.data(), view.size(), d);
          },
          nb::arg("data"), nb::arg("device").none() = nb::none(),
          nb::sig("def deserialize(data: bytes | bytearray | memoryview, device: str | None = None) -> Bundle"))
      .def_prop_ro("inputs", [](const Bundle& b) { return io_list(b.inputs()); })
      .def_prop_ro("outputs", [](const Bundle& b) { return io_list(b.outputs()); })
      .def_prop_ro("engines", &Bundle::engines)
      .def_prop_ro("device", [](const Bundle& b) { return b.device().to_string(); })
      .def_prop_ro("kiln_version", &Bundle::kiln_version)
      .def_prop_ro(
          "steps",
          [](const Bundle& b) {
            std::vector<std::tuple<std::string, uint32_t, std::vector<RefTuple>>> out;
            for (const BundleStep& s : b.program().steps) {
              std::vector<RefTuple> args;
              for (const BundleRef& a : s.args) args.emplace_back(a.step, a.index);
              out.emplace_back(s.name, s.engine, std::move(args));
            }
            return out;
          },
          "Each engine call: (name, engine index, arguments as (-1, input) or (step, output)).")
      .def("create_context", &Bundle::create_context, nb::arg("use_graphs") = true,
           "A context with its own buffers; use_graphs replays captured CUDA graphs per engine call. A dynamic "
           "bundle's runs at the sizes it was compiled at (at() for others).")
      .def_prop_ro("dynamic", &Bundle::dynamic, "Whether an input has a symbolic dim (see at()).")
      .def(
          "bind", [](const Bundle& b, const std::vector<std::vector<int64_t>>& shapes) { return b.bind(shapes); },
          nb::arg("shapes"), "The binding of the inputs' symbols that inputs of these shapes give.")
      .def(
          "at",
          [](const Bundle& b, const SymbolBinding& binding) {
            nb::gil_scoped_release release;
            return std::const_pointer_cast<Bundle>(b.at(binding));
          },
          nb::arg("binding"), "This bundle at a binding of its symbols: a static bundle (instances made now).")
      .def(
          "run",
          [](const Bundle& b, const std::vector<InArray>& arrays) {
            if (!b.dynamic()) return run_arrays(*b.create_context(), arrays);
            std::vector<std::vector<int64_t>> shapes;
            for (const InArray& a : arrays) shapes.emplace_back(a.shape_ptr(), a.shape_ptr() + a.ndim());
            const SymbolBinding binding = b.bind(shapes);
            std::shared_ptr<const Bundle> sized;
            {
              nb::gil_scoped_release release;
              sized = b.at(binding);
            }
            return run_arrays(*sized->create_context(), arrays);
          },
          nb::arg("inputs"), nb::sig("def run(self, inputs: Sequence[numpy.ndarray]) -> list[numpy.ndarray]"),
          "Runs on CPU arrays in the bundle's input order (a context made for the call; a dynamic bundle at the "
          "sizes of the arrays); returns numpy arrays.");

  nb::class_<BundleContext>(m, "BundleContext", "Runs a bundle; one call at a time per context.")
      .def("run", &run_arrays, nb::arg("inputs"),
           nb::sig("def run(self, inputs: Sequence[numpy.ndarray]) -> list[numpy.ndarray]"),
           "Runs on CPU arrays in the bundle's input order; returns numpy arrays.")
      .def(
          "execute_ptrs",
          [](BundleContext& ctx, const std::vector<nb::handle>& ins, const std::vector<nb::handle>& outs,
             nb::handle stream) {
            std::vector<void*> in = addresses(ins, "input_ptrs");
            const std::vector<void*> out = addresses(outs, "output_ptrs");
            void* s = stream.is_none() ? nullptr : pointer_from_int(stream, "stream");
            ctx.execute(std::vector<const void*>(in.begin(), in.end()), out, s);
          },
          nb::arg("input_ptrs"), nb::arg("output_ptrs"), nb::arg("stream").none() = 0,
          nb::sig("def execute_ptrs(self, input_ptrs: Sequence[int], output_ptrs: Sequence[int], "
                  "stream: int | None = 0) -> None"),
          "Runs on raw addresses of dense buffers on the bundle's device, in its input/output order.");
}

}  // namespace kiln::python
