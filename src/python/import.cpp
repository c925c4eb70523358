// Bindings of kiln/import.h: the plain description of an ATen graph that the torch front end
// fills in, can_import, import_aten and the list of supported overloads.
//
// The front end converts every FX node, so the conversion must cost little per argument:
// ImportGraph.add_node takes the node's arguments as plain Python values (None, bool, int,
// float, str, DType, nested lists/tuples) and converts them in one C++ pass; only tensor
// references need an object (ImportArg.of_tensor(id)), since they are otherwise ints.
// Constants are copied once, from a buffer (bytes, numpy) or from a host address; descriptions of
// the same weights may share one copy (ConstantBytes).
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <sstream>

#include "kiln/builder.h"
#include "kiln/errors.h"
#include "kiln/import.h"
#include "src/python/bindings.h"

namespace kiln::python {

namespace {

ImportArg arg_from_python(nb::handle v, int depth = 0) {
  PyObject* o = v.ptr();
  if (o == Py_None) return ImportArg::none();
  if (PyBool_Check(o)) return ImportArg::of_bool(o == Py_True);
  if (PyLong_Check(o)) {
    int64_t i = PyLong_AsLongLong(o);
    if (i == -1 && PyErr_Occurred()) throw nb::python_error();
    return ImportArg::of_int(i);
  }
  if (PyFloat_Check(o)) return ImportArg::of_float(PyFloat_AS_DOUBLE(o));
  if (PyUnicode_Check(o)) return ImportArg::of_string(nb::cast<std::string>(v));
  if (nb::isinstance<ImportArg>(v)) return nb::cast<const ImportArg&>(v);
  if (nb::isinstance<DType>(v)) return ImportArg::of_dtype(nb::cast<DType>(v));
  if (PyList_Check(o) || PyTuple_Check(o)) {
    KILN_CHECK(depth < 32, kInvalidArgument, "import argument lists nest too deeply");
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject** items = PySequence_Fast_ITEMS(o);
    std::vector<ImportArg> list;
    list.reserve(size_t(n));
    for (Py_ssize_t i = 0; i < n; ++i) list.push_back(arg_from_python(items[i], depth + 1));
    return ImportArg::of_list(std::move(list));
  }
  if (PyIndex_Check(o)) {  // numpy / torch integer scalars
    int64_t i = PyLong_AsLongLong(nb::steal(PyNumber_Index(o)).ptr());
    if (i == -1 && PyErr_Occurred()) throw nb::python_error();
    return ImportArg::of_int(i);
  }
  KILN_FAIL(kInvalidArgument, "cannot describe a value of type ", nb::inst_name(v).c_str(),
            " as an import argument; expected None, bool, int, float, str, DType, ImportArg or a list of them");
}

std::vector<ImportArg> args_from_python(nb::handle seq) {
  if (!PyList_Check(seq.ptr()) && !PyTuple_Check(seq.ptr()))
    KILN_FAIL(kInvalidArgument, "import node arguments must be a list or tuple, got ", nb::inst_name(seq).c_str());
  return arg_from_python(seq).list;
}

std::vector<std::pair<std::string, ImportArg>> kwargs_from_python(nb::handle obj) {
  std::vector<std::pair<std::string, ImportArg>> out;
  if (obj.is_none()) return out;
  if (!PyDict_Check(obj.ptr()))
    KILN_FAIL(kInvalidArgument, "import node keyword arguments must be a dict, got ", nb::inst_name(obj).c_str());
  for (auto [k, v] : nb::borrow<nb::dict>(obj)) out.emplace_back(nb::cast<std::string>(k), arg_from_python(v));
  return out;
}

nb::object arg_to_python(const ImportArg& a) {
  using K = ImportArg::Kind;
  switch (a.kind) {
    case K::kNone: return nb::none();
    case K::kBool: return nb::bool_(a.b);
    case K::kInt: return nb::int_(a.i);
    case K::kFloat: return nb::float_(a.f);
    case K::kString: return nb::str(a.s.c_str(), a.s.size());
    case K::kDType: return nb::cast(a.dtype);
    case K::kTensor: return nb::cast(a);
    case K::kList: {
      nb::list l;
      for (const auto& x : a.list) l.append(arg_to_python(x));
      return l;
    }
  }
  return nb::none();
}

std::string arg_repr(const ImportArg& a) {
  using K = ImportArg::Kind;
  switch (a.kind) {
    case K::kNone: return "None";
    case K::kBool: return a.b ? "True" : "False";
    case K::kInt: return std::to_string(a.i);
    case K::kFloat: {
      std::ostringstream os;
      os << a.f;
      return os.str();
    }
    case K::kString: return "'" + a.s + "'";
    case K::kDType: return std::string("DType.") + dtype_name(a.dtype);
    case K::kTensor: return "%" + std::to_string(a.tensor);
    case K::kList: {
      std::string s = "[";
      for (size_t i = 0; i < a.list.size(); ++i) s += (i ? ", " : "") + arg_repr(a.list[i]);
      return s + "]";
    }
  }
  return "?";
}

ImportTensor make_tensor(DType dtype, nb::handle shape, nb::handle strides, std::vector<std::string> symbols,
                         std::vector<int64_t> sym_min, std::vector<int64_t> sym_max) {
  ImportTensor t;
  t.dtype = dtype;
  t.shape = shape_from_sequence(shape, "shape");
  if (!strides.is_none()) t.strides = shape_from_sequence(strides, "strides");
  t.symbols = std::move(symbols);
  t.sym_min = std::move(sym_min);
  t.sym_max = std::move(sym_max);
  return t;
}

ImportNode make_node(std::string target, nb::handle args, nb::handle kwargs, std::vector<int32_t> outputs,
                     std::string name) {
  ImportNode n;
  n.target = std::move(target);
  n.name = std::move(name);
  n.args = args_from_python(args);
  n.kwargs = kwargs_from_python(kwargs);
  n.outputs = std::move(outputs);
  return n;
}

void check_tensor_id(const ImportGraph& g, int32_t id, const char* what) {
  KILN_CHECK(id >= 0 && size_t(id) < g.tensors.size(), kInvalidArgument, what, ": tensor id ", id,
             " out of range (", g.tensors.size(), " tensors)");
}

size_t dense_bytes(const ImportTensor& t) {
  size_t n = dtype_size(t.dtype);
  for (int64_t e : t.shape) n *= size_t(e < 0 ? 0 : e);
  return n;
}

// The host bytes of one constant, which several descriptions of the same weights share (the
// samples of a dynamic program's range fit) instead of copying them again.
struct ConstantBytes {
  std::shared_ptr<const HostBuffer> data;
};

// Refuses a constant for an unknown tensor or of the wrong size.
void check_constant(const ImportGraph& g, int32_t tensor, const std::string& name, size_t nbytes) {
  check_tensor_id(g, tensor, "add_constant");
  size_t want = dense_bytes(g.tensors[size_t(tensor)]);
  KILN_CHECK(nbytes == want, kInvalidArgument, "constant '", name, "' (tensor ", tensor, ") needs ", want,
             " dense bytes, got ", nbytes);
}

void add_shared_bytes(ImportGraph& g, int32_t tensor, const std::string& name, std::shared_ptr<const HostBuffer> bytes,
                      bool weight) {
  check_constant(g, tensor, name, bytes->size());
  g.constants.push_back(ImportConstant{tensor, name, std::move(bytes), weight});
}

ConstantBytes add_constant_bytes(ImportGraph& g, int32_t tensor, const std::string& name, const void* data,
                                 size_t nbytes, bool weight) {
  check_constant(g, tensor, name, nbytes);
  KILN_CHECK(data != nullptr || nbytes == 0, kInvalidArgument, "constant '", name, "' has a null data pointer");
  auto bytes = std::make_shared<HostBuffer>(nbytes);
  if (nbytes) std::memcpy(bytes->data(), data, nbytes);
  g.constants.push_back(ImportConstant{tensor, name, bytes, weight});
  return ConstantBytes{std::move(bytes)};
}

}  // namespace

void bind_import(nb::module_& m) {
  nb::enum_<ImportArg::Kind>(m, "ImportArgKind")
      .value("none", ImportArg::Kind::kNone)
      .value("bool", ImportArg::Kind::kBool)
      .value("int", ImportArg::Kind::kInt)
      .value("float", ImportArg::Kind::kFloat)
      .value("string", ImportArg::Kind::kString)
      .value("dtype", ImportArg::Kind::kDType)
      .value("tensor", ImportArg::Kind::kTensor)
      .value("list", ImportArg::Kind::kList);

  nb::class_<ImportArg>(m, "ImportArg", "One argument of an ATen node.")
      .def(nb::init<>())
      .def_static("none", &ImportArg::none)
      .def_static("of_bool", &ImportArg::of_bool, nb::arg("value"))
      .def_static("of_int", &ImportArg::of_int, nb::arg("value"))
      .def_static("of_float", &ImportArg::of_float, nb::arg("value"))
      .def_static("of_string", &ImportArg::of_string, nb::arg("value"))
      .def_static("of_dtype", &ImportArg::of_dtype, nb::arg("value"))
      .def_static("of_tensor", &ImportArg::of_tensor, nb::arg("tensor_id"))
      .def_static("of_list", [](nb::handle items) { return ImportArg::of_list(args_from_python(items)); },
                  nb::arg("items"), nb::sig("def of_list(items: collections.abc.Sequence[object]) -> ImportArg"))
      .def_static("from_value", [](nb::handle v) { return arg_from_python(v); }, nb::arg("value"),
                  "None, bool, int, float, str, DType, ImportArg or (nested) lists of them -> ImportArg.")
      .def_rw("kind", &ImportArg::kind)
      .def_rw("b", &ImportArg::b)
      .def_rw("i", &ImportArg::i)
      .def_rw("f", &ImportArg::f)
      .def_rw("s", &ImportArg::s)
      .def_rw("dtype", &ImportArg::dtype)
      .def_rw("tensor", &ImportArg::tensor)
      .def_rw("list", &ImportArg::list)
      .def("to_value", &arg_to_python, nb::sig("def to_value(self) -> object"), "The Python value (tensor references stay ImportArg).")
      .def("__repr__", [](const ImportArg& a) { return "ImportArg(" + arg_repr(a) + ")"; });

  nb::class_<ImportTensor>(m, "ImportTensor", "Metadata of one tensor of an ATen graph.")
      .def(
          "__init__",
          [](ImportTensor* t, DType dtype, nb::handle shape, nb::handle strides, std::vector<std::string> symbols,
             std::vector<int64_t> sym_min, std::vector<int64_t> sym_max) {
            new (t) ImportTensor(
                make_tensor(dtype, shape, strides, std::move(symbols), std::move(sym_min), std::move(sym_max)));
          },
          nb::arg("dtype"), nb::arg("shape"), nb::arg("strides") = nb::none(),
          nb::arg("symbols") = std::vector<std::string>{}, nb::arg("sym_min") = std::vector<int64_t>{},
          nb::arg("sym_max") = std::vector<int64_t>{},
          nb::sig("def __init__(self, dtype: DType, shape: collections.abc.Sequence[int], "
                  "strides: collections.abc.Sequence[int] | None = None, symbols: collections.abc.Sequence[str] = [], "
                  "sym_min: collections.abc.Sequence[int] = [], sym_max: collections.abc.Sequence[int] = []) -> None"))
      .def_rw("dtype", &ImportTensor::dtype)
      .def_rw("shape", &ImportTensor::shape)
      .def_rw("strides", &ImportTensor::strides)
      .def_rw("symbols", &ImportTensor::symbols)
      .def_rw("sym_min", &ImportTensor::sym_min)
      .def_rw("sym_max", &ImportTensor::sym_max)
      .def_rw("sized", &ImportTensor::sized,
              "Its size depends on shape symbols: its node is not folded into a constant.");

  nb::class_<ImportNode>(m, "ImportNode", "One ATen node: overload name, arguments and output tensor ids.")
      .def("__init__", [](ImportNode* n, std::string target, nb::handle args, nb::handle kwargs,
                          std::vector<int32_t> outputs, std::string name) {
        new (n) ImportNode(make_node(std::move(target), args, kwargs, std::move(outputs), std::move(name)));
      }, nb::arg("target"), nb::arg("args") = nb::list(), nb::arg("kwargs") = nb::none(),
         nb::arg("outputs") = std::vector<int32_t>{}, nb::arg("name") = "",
         nb::sig("def __init__(self, target: str, args: collections.abc.Sequence[object] = [], "
                 "kwargs: collections.abc.Mapping[str, object] | None = None, "
                 "outputs: collections.abc.Sequence[int] = [], name: str = '') -> None"))
      .def_rw("target", &ImportNode::target)
      .def_rw("name", &ImportNode::name)
      .def_prop_rw("args", [](const ImportNode& n) { return n.args; },
                   [](ImportNode& n, nb::typed<nb::handle, std::vector<ImportArg>> v) { n.args = args_from_python(v); })
      .def_prop_rw("kwargs", [](const ImportNode& n) {
        nb::typed<nb::dict, nb::str, nb::object> d{nb::dict()};
        for (const auto& [k, v] : n.kwargs) d[k.c_str()] = arg_to_python(v);
        return d;
      }, [](ImportNode& n, nb::typed<nb::handle, nb::dict> v) { n.kwargs = kwargs_from_python(v); })
      .def_rw("outputs", &ImportNode::outputs)
      .def("__repr__", [](const ImportNode& n) { return "ImportNode('" + n.target + "', '" + n.name + "')"; });

  nb::class_<ImportConstant>(m, "ImportConstant", "A weight or buffer of an ATen graph (bytes held by Kiln).")
      .def_ro("tensor", &ImportConstant::tensor)
      .def_ro("name", &ImportConstant::name)
      .def_ro("weight", &ImportConstant::weight)
      .def_prop_ro("nbytes", [](const ImportConstant& c) { return c.data ? c.data->size() : 0; })
      .def_prop_ro("data", [](const ImportConstant& c) {
        return c.data ? nb::bytes(reinterpret_cast<const char*>(c.data->data()), c.data->size()) : nb::bytes("", 0);
      }, "A copy of the bytes.");

  nb::class_<ImportSupport>(m, "ImportSupport", "can_import's answer; truthy when supported.")
      .def_ro("supported", &ImportSupport::supported)
      .def_ro("reason", &ImportSupport::reason)
      .def("__bool__", [](const ImportSupport& s) { return s.supported; })
      .def("__repr__", [](const ImportSupport& s) {
        return s.supported ? std::string("ImportSupport(True)") : "ImportSupport(False, '" + s.reason + "')";
      });

  nb::class_<ConstantBytes>(m, "ConstantBytes", "The host bytes of one described constant, shared by descriptions.")
      .def_prop_ro("nbytes", [](const ConstantBytes& c) { return c.data->size(); }, "Its size in bytes.");

  nb::class_<ImportGraph>(m, "ImportGraph", "A whole ATen graph: tensors, inputs, constants, nodes, outputs.")
      .def(nb::init<>())
      .def(
          "add_tensor",
          [](ImportGraph& g, DType dtype, nb::handle shape, nb::handle strides, std::vector<std::string> symbols,
             std::vector<int64_t> sym_min, std::vector<int64_t> sym_max, bool sized) {
            ImportTensor t =
                make_tensor(dtype, shape, strides, std::move(symbols), std::move(sym_min), std::move(sym_max));
            t.sized = sized;
            return g.add_tensor(std::move(t));
          },
          nb::arg("dtype"), nb::arg("shape"), nb::arg("strides") = nb::none(),
          nb::arg("symbols") = std::vector<std::string>{}, nb::arg("sym_min") = std::vector<int64_t>{},
          nb::arg("sym_max") = std::vector<int64_t>{}, nb::arg("sized") = false,
          nb::sig("def add_tensor(self, dtype: DType, shape: collections.abc.Sequence[int], "
                  "strides: collections.abc.Sequence[int] | None = None, symbols: collections.abc.Sequence[str] = [], "
                  "sym_min: collections.abc.Sequence[int] = [], sym_max: collections.abc.Sequence[int] = [], "
                  "sized: bool = False) -> int"),
          "Returns the new tensor's id. ``sized``: its size depends on shape symbols (not folded into a constant).")
      .def(
          "add_tensor", [](ImportGraph& g, const ImportTensor& t) { return g.add_tensor(t); }, nb::arg("tensor"))
      .def(
          "add_input",
          [](ImportGraph& g, int32_t tensor, std::string name) {
            check_tensor_id(g, tensor, "add_input");
            g.inputs.emplace_back(tensor, std::move(name));
          },
          nb::arg("tensor"), nb::arg("name"))
      .def(
          "add_output",
          [](ImportGraph& g, int32_t tensor, std::string name) {
            check_tensor_id(g, tensor, "add_output");
            g.outputs.emplace_back(tensor, std::move(name));
          },
          nb::arg("tensor"), nb::arg("name"))
      .def(
          "add_constant",
          [](ImportGraph& g, int32_t tensor, const std::string& name, nb::handle data, bool weight) {
            BufferView view(data, "add_constant data");
            add_constant_bytes(g, tensor, name, view.data(), view.size(), weight);
          },
          nb::arg("tensor"), nb::arg("name"), nb::arg("data"), nb::arg("weight") = true,
          nb::sig(
              "def add_constant(self, tensor: int, name: str, data: bytes | bytearray | memoryview | numpy.ndarray, "
              "weight: bool = True) -> None"),
          "A constant copied from a C-contiguous buffer (bytes, numpy array, ...).")
      .def(
          "add_constant_from_ptr",
          [](ImportGraph& g, int32_t tensor, const std::string& name, nb::handle data_ptr, size_t nbytes, bool weight) {
            return add_constant_bytes(g, tensor, name, pointer_from_int(data_ptr, "data_ptr"), nbytes, weight);
          },
          nb::arg("tensor"), nb::arg("name"), nb::arg("data_ptr"), nb::arg("nbytes"), nb::arg("weight") = true,
          nb::sig("def add_constant_from_ptr(self, tensor: int, name: str, data_ptr: int, nbytes: int, "
                  "weight: bool = True) -> ConstantBytes"),
          "A constant copied from host memory (e.g. a CPU torch tensor's data_ptr()); returns the copy, "
          "which add_shared_constant gives other descriptions of the same tensor.")
      .def(
          "add_shared_constant",
          [](ImportGraph& g, int32_t tensor, const std::string& name, const ConstantBytes& data, bool weight) {
            add_shared_bytes(g, tensor, name, data.data, weight);
          },
          nb::arg("tensor"), nb::arg("name"), nb::arg("data"), nb::arg("weight") = true,
          "A constant whose bytes another description copied (add_constant_from_ptr), shared, not copied.")
      .def(
          "add_node",
          [](ImportGraph& g, std::string target, nb::handle args, nb::handle kwargs, std::vector<int32_t> outputs,
             std::string name) {
            g.nodes.push_back(make_node(std::move(target), args, kwargs, std::move(outputs), std::move(name)));
          },
          nb::arg("target"), nb::arg("args"), nb::arg("kwargs") = nb::none(),
          nb::arg("outputs") = std::vector<int32_t>{}, nb::arg("name") = "",
          nb::sig("def add_node(self, target: str, args: collections.abc.Sequence[object], "
                  "kwargs: collections.abc.Mapping[str, object] | None = None, "
                  "outputs: collections.abc.Sequence[int] = [], name: str = '') -> None"),
          "Appends a node; args are plain values, tensors as ImportArg.of_tensor(id).")
      .def(
          "add_node", [](ImportGraph& g, const ImportNode& n) { g.nodes.push_back(n); }, nb::arg("node"))
      .def_prop_ro("num_tensors", [](const ImportGraph& g) { return g.tensors.size(); })
      .def_prop_ro("num_nodes", [](const ImportGraph& g) { return g.nodes.size(); })
      .def(
          "tensor",
          [](const ImportGraph& g, int32_t id) {
            check_tensor_id(g, id, "tensor");
            return g.tensors[size_t(id)];
          },
          nb::arg("id"))
      .def_ro("tensors", &ImportGraph::tensors, "A copy of the tensor table.")
      .def_ro("inputs", &ImportGraph::inputs)
      .def_ro("outputs", &ImportGraph::outputs)
      .def_ro("constants", &ImportGraph::constants)
      .def_ro("nodes", &ImportGraph::nodes);

  m.def(
      "can_import", [](const ImportNode& node, const ImportGraph& graph) { return can_import(node, graph); },
      nb::arg("node"), nb::arg("graph"),
      "Whether Kiln has an importer for node.target that accepts these arguments and metadata.");
  nb::class_<BuildTrial>(m, "BuildTrial",
                         "The partitioner's question about each node of a graph, asked in FX order: the importers "
                         "(each accepted node joins one trial graph), then the backend for the device about the ops "
                         "it converted to. No device needs to be present.")
      .def(
          "__init__", [](BuildTrial* t, const std::string& device) { new (t) BuildTrial(Device::parse(device).type); },
          nb::arg("device"))
      .def("add", &BuildTrial::add, nb::arg("node"), nb::arg("graph"),
           "Whether Kiln can build this node for the device, after the nodes added before it.");
  m.def("import_aten", &import_aten, nb::arg("graph"),
        "The whole description -> Graph; raises UnsupportedError naming the first node it cannot take.");
  m.def("supported_aten_targets", &supported_aten_targets, "Every ATen overload with an importer, sorted.");
}

}  // namespace kiln::python
