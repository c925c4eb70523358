// Bindings of kiln/engine.h: IOTensor, Engine and ExecutionContext.
//
// Two ways to run a context:
//   execute(arrays) -> arrays   convenience: CPU arrays in (numpy or DLPack), numpy out; shapes
//                               and dtypes are checked (execute_checked). Engines on another
//                               device get their buffers staged through device memory.
//   execute_ptrs(ins, outs, stream)  the hot path of the torch runtime module: raw addresses
//                               of buffers already on the engine's device, only the counts are
//                               checked. The GIL stays held: releasing and retaking it is a
//                               real part of so short a call, and would let two Python threads
//                               race on one context, which runs one call at a time.
// A context holds its engine (shared_ptr), so dropping the Python Engine first is safe.
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <filesystem>
#include <memory>

#include "kiln/engine.h"
#include "kiln/errors.h"
#include "src/python/bindings.h"

// Engine holds kernels by unique_ptr, which the copy-constructibility trait cannot see.
template <>
struct nanobind::detail::is_copy_constructible<kiln::Engine> : std::false_type {};

namespace kiln::python {

namespace {

using InArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;
using OutArray = nb::ndarray<nb::numpy, nb::c_contig, nb::device::cpu>;

// A numpy array of the given type, owning fresh memory.
OutArray new_array(const IOTensor& io) {
  KILN_CHECK(io.type.dtype != DType::kBF16, kUnsupported, "output '", io.name,
             "' is bf16, which numpy cannot hold; use execute_ptrs with torch tensors");
  std::vector<size_t> shape;
  for (int64_t e : io.type.shape()) shape.push_back(size_t(e));
  auto buf = std::make_unique<uint8_t[]>(std::max<size_t>(io.type.nbytes(), 1));
  nb::capsule owner(buf.get(), [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
  uint8_t* data = buf.release();  // now owned by the capsule
  return OutArray(data, shape.size(), shape.data(), owner, nullptr, dlpack_of(io.type.dtype));
}

nb::typed<nb::list, OutArray> execute_arrays(ExecutionContext& ctx, const std::vector<InArray>& arrays) {
  const Engine& e = ctx.engine();
  KILN_CHECK(arrays.size() == e.inputs().size(), kInvalidArgument, "engine takes ", e.inputs().size(),
             " inputs, got ", arrays.size());
  std::vector<const void*> ins;
  std::vector<TensorType> in_types;
  for (size_t i = 0; i < arrays.size(); ++i) {
    std::vector<int64_t> shape(arrays[i].shape_ptr(), arrays[i].shape_ptr() + arrays[i].ndim());
    in_types.emplace_back(dtype_from_dlpack(arrays[i].dtype(), "input '" + e.inputs()[i].name + "'"), shape);
    ins.push_back(arrays[i].data());
  }
  std::vector<OutArray> results;
  std::vector<void*> outs;
  std::vector<TensorType> out_types;
  for (const IOTensor& io : e.outputs()) {
    results.push_back(new_array(io));
    outs.push_back(results.back().data());
    out_types.push_back(io.type);
  }

  if (e.device().type == DeviceType::kCPU) {
    ctx.execute_checked(ins, in_types, outs, out_types);
  } else {
    // Stage through device memory: a convenience path, not the fast one.
    Backend& be = get_backend(e.device());
    std::vector<std::shared_ptr<void>> dev;
    std::vector<const void*> dev_in;
    std::vector<void*> dev_out;
    for (size_t i = 0; i < ins.size(); ++i) {
      dev.push_back(be.allocate(std::max<size_t>(in_types[i].nbytes(), 1)));
      be.copy_from_host(dev.back().get(), ins[i], in_types[i].nbytes(), nullptr);
      dev_in.push_back(dev.back().get());
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      dev.push_back(be.allocate(std::max<size_t>(out_types[i].nbytes(), 1)));
      dev_out.push_back(dev.back().get());
    }
    ctx.execute_checked(dev_in, in_types, dev_out, out_types);
    for (size_t i = 0; i < outs.size(); ++i) be.copy_to_host(outs[i], dev_out[i], out_types[i].nbytes(), nullptr);
    be.synchronize(nullptr);
  }
  nb::typed<nb::list, OutArray> out{nb::list()};
  for (auto& r : results) out.append(nb::cast(r, nb::rv_policy::reference));
  return out;
}

// Addresses from a list of ints into a reused vector: no allocation once warm.
template <typename Ptr>
void read_ptrs(nb::handle seq, std::vector<Ptr>& out, const char* what) {
  nb::object holder;  // lists and tuples are read in place; other sequences are copied once
  if (!PyList_Check(seq.ptr()) && !PyTuple_Check(seq.ptr())) {
    if (!PySequence_Check(seq.ptr())) KILN_FAIL(kInvalidArgument, what, " must be a sequence of int addresses");
    holder = nb::steal(PySequence_Fast(seq.ptr(), what));
    if (!holder.is_valid()) throw nb::python_error();
    seq = holder;
  }
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  out.resize(size_t(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    void* p = PyLong_AsVoidPtr(items[i]);
    if (p == nullptr && PyErr_Occurred()) {
      PyErr_Clear();
      KILN_FAIL(kInvalidArgument, what, "[", i, "] must be an int address, got ", nb::inst_name(items[i]).c_str());
    }
    out[size_t(i)] = static_cast<Ptr>(p);
  }
}

void execute_ptrs(ExecutionContext& ctx, nb::handle inputs, nb::handle outputs, nb::handle stream) {
  thread_local std::vector<const void*> ins;
  thread_local std::vector<void*> outs;
  read_ptrs(inputs, ins, "input_ptrs");
  read_ptrs(outputs, outs, "output_ptrs");
  void* s = PyLong_Check(stream.ptr()) ? PyLong_AsVoidPtr(stream.ptr()) : pointer_from_int(stream, "stream");
  if (s == nullptr && PyErr_Occurred()) throw nb::python_error();
  ctx.execute(ins, outs, s);
}

std::shared_ptr<Engine> engine_of(const ExecutionContext& ctx) {
  return std::const_pointer_cast<Engine>(ctx.engine().shared_from_this());
}

nb::typed<nb::list, IOTensor> io_list(const std::vector<IOTensor>& v) {
  nb::typed<nb::list, IOTensor> out{nb::list()};
  for (const auto& io : v) out.append(nb::cast(io));
  return out;
}

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<IOTensor>(m, "IOTensor", "An engine input or output: name and type.")
      .def_ro("name", &IOTensor::name)
      .def_ro("type", &IOTensor::type)
      .def_prop_ro("dtype", [](const IOTensor& t) { return t.type.dtype; })
      .def_prop_ro("shape", [](const IOTensor& t) { return t.type.shape(); })
      .def("__repr__", [](const IOTensor& t) { return "IOTensor('" + t.name + "', " + t.type.to_string() + ")"; });

  nb::class_<SharedArena>(m, "SharedArena",
                          "Activation memory that contexts of several engines share (one call at a time).")
      .def_prop_ro("bytes", [](const SharedArena& a) { return a.bytes; });

  nb::class_<Engine>(m, "Engine",
                     "A built engine: the plan, its kernels and its constants (weights change only by a Refitter).")
      .def_prop_ro("inputs", [](const Engine& e) { return io_list(e.inputs()); })
      .def_prop_ro("outputs", [](const Engine& e) { return io_list(e.outputs()); })
      .def_prop_ro("weight_names", &Engine::weight_names)
      .def_prop_ro("build_log", &Engine::build_log)
      .def_prop_ro(
          "policy", [](const Engine& e) { return e.kernel_options().policy; },
          "The BuildPolicy the engine was built with (saved in its file; older files: the default).")
      .def_prop_ro(
          "optimization_level", [](const Engine& e) { return e.kernel_options().optimization_level; },
          "The optimization level the engine was built at.")
      .def_prop_ro("device", [](const Engine& e) { return e.device().to_string(); })
      .def_prop_ro(
          "arena_bytes", [](const Engine& e) { return e.memory_plan().arena_bytes; },
          "Bytes of activation memory each context allocates.")
      .def_prop_ro(
          "naive_bytes", [](const Engine& e) { return e.memory_plan().naive_bytes; },
          "Bytes the intermediates would need without reuse.")
      .def_prop_ro("workspace_size", &Engine::workspace_size)
      .def_prop_ro("borrowed_bytes", &Engine::borrowed_bytes,
                   "Bytes of weights the engine reads in place from the memory they were borrowed from.")
      .def_prop_ro("refittable", &Engine::refittable,
                   "Whether a Refitter can change the weights (built with refittable=True).")
      .def_prop_ro("weights_version", &Engine::weights_version, "How many refits the engine has had.")
      .def_prop_rw("source_weights_id", &Engine::source_weights_id, &Engine::set_source_weights_id,
                   "An opaque label of the weights the constants came from (saved; a refit clears it).")
      .def_prop_ro("num_nodes", [](const Engine& e) { return e.graph().nodes().size(); })
      .def_prop_ro(
          "graph_text", [](const Engine& e) { return e.graph().to_string(); }, "The plan as text.")
      .def(
          "graph", [](const Engine& e) { return Graph(e.graph()); }, "A copy of the optimized plan.")
      .def(
          "instance",
          [](const Engine& e, const Graph& plan, int optimization_level, bool precompiled_only, bool background) {
            KernelOptions options = e.kernel_options();
            options.optimization_level = optimization_level;
            options.precompiled_only = precompiled_only;
            options.background = background;
            nb::gil_scoped_release release;
            return e.instance(plan, options);
          },
          nb::arg("plan"), nb::arg("optimization_level") = 0, nb::arg("precompiled_only") = false,
          nb::arg("background") = false,
          "An engine running ``plan`` (SizeProgram.evaluate of graph(): other sizes) on this engine's constants, "
          "its kernels made at ``optimization_level`` (0: untimed); ``precompiled_only``: no kernel that compiles "
          "library code when made (cuDNN's runtime-compiled engines passed over where another serves); ``background``: "
          "made while calls run, its device work after theirs (the build turn's background priority).")
      .def_prop_ro(
          "is_instance", [](const Engine& e) { return e.instance_of() != nullptr; },
          "Whether the engine is an instance of another (runs on its constants).")
      .def("allocate_arena", &Engine::allocate_arena, nb::arg("bytes"),
           "``bytes`` of activation memory on the engine's device, for contexts to share.")
      .def(
          "arena_bound",
          [](const Engine& e, const Graph& plan) {
            return Engine::arena_bound(plan, get_backend(e.device()).alignment());
          },
          nb::arg("plan"), "The activation bytes an engine for ``plan`` on this engine's device needs at most.")
      .def("create_execution_context", &Engine::create_execution_context, nb::arg("use_graphs") = true,
           nb::arg("arena") = nb::none(),
           "A context with its own activation memory (or ``arena``'s, a SharedArena large enough); use_graphs "
           "replays one captured CUDA graph per call.")
      .def(
          "serialize",
          [](const Engine& e, const Engine* kernels_of) {
            Bytes b = kernels_of != nullptr ? e.serialize_with_kernels_of(*kernels_of) : e.serialize();
            return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
          },
          nb::arg("kernels_of") = nb::none(),
          "The engine file's bytes; ``kernels_of``: an instance of this engine at its own sizes whose kernels "
          "(their choices and optimization level) the file holds in place of the engine's own.")
      .def_static(
          "deserialize",
          [](nb::handle data, const std::string& device) {
            BufferView view(data, "Engine.deserialize data");
            const Device d = Device::parse(device);
            nb::gil_scoped_release release;  // other Python threads run while the engine loads
            return Engine::deserialize(view.data(), view.size(), d);
          },
          nb::arg("data"), nb::arg("device") = "cpu",
          nb::sig("def deserialize(data: bytes | bytearray | memoryview, device: str = 'cpu') -> Engine"),
          "Rebuilds an engine from serialize()'s bytes; raises an EngineFileError subclass naming the problem.")
      .def(
          "save", [](const Engine& e, const std::filesystem::path& p) { e.save(p.string()); }, nb::arg("path"))
      .def_static(
          "load",
          [](const std::filesystem::path& p, const std::string& device) {
            return Engine::load(p.string(), Device::parse(device));
          },
          nb::arg("path"), nb::arg("device") = "cpu")
      .def_static(
          "load_mapped",
          [](const std::filesystem::path& p, const std::string& device) {
            const Device d = Device::parse(device);
            nb::gil_scoped_release release;  // other Python threads run while the engine loads
            return Engine::load_mapped(p.string(), d);
          },
          nb::arg("path"), nb::arg("device") = "cpu",
          "As load, but the engine's weights are views of the file mapped copy-on-write (no copy; a refit's writes "
          "stay private). The file must not be rewritten in place while the engine lives: replace it by rename.");

  nb::class_<ExecutionContext>(m, "ExecutionContext", "Runs an engine; one call at a time per context.")
      .def_prop_ro("engine", &engine_of)
      .def_prop_ro(
          "uses_graphs", &ExecutionContext::uses_graphs,
          "Whether calls replay a captured graph (false on the CPU, when turned off, or after a failed capture).")
      .def_prop_ro("shares_arena", &ExecutionContext::shares_arena,
                   "Whether the activations live in the SharedArena given at creation.")
      .def_prop_ro("graph_refusal", &ExecutionContext::graph_refusal,
                   "Why graph replay was given up for direct launches ('' when it was not).")
      .def_prop_ro("graph_captures", &ExecutionContext::graph_captures,
                   "Graphs captured so far: the staging graph (again after a refit) and those on the caller's own "
                   "buffers (buffers that come again within a few calls).")
      .def("execute", &execute_arrays, nb::arg("inputs"),
           "Runs on CPU arrays (numpy or DLPack) in the engine's input order; returns new numpy arrays.")
      .def("execute_ptrs", &execute_ptrs, nb::arg("input_ptrs"), nb::arg("output_ptrs"), nb::arg("stream") = 0,
           nb::sig("def execute_ptrs(self, input_ptrs: collections.abc.Sequence[int], "
                   "output_ptrs: collections.abc.Sequence[int], stream: int = 0) -> None"),
           "Runs on raw device addresses in the engine's input/output order. Only the counts are checked.");
}

}  // namespace kiln::python
