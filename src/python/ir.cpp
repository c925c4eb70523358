// Bindings of kiln/ops.h and kiln/ir.h: the op list, Dim, TensorType, Value, Node and Graph.
//
// Graph.add_node takes the op by name and its attributes as a dict of plain Python values;
// attribute types follow the Python value (bool, int, float, str, DType, list of ints, list
// of floats), so the op's shape rule sees exactly what the C++ API would give it. Value and
// Node are read-only views for inspection; a Node view keeps its graph alive.
#include <nanobind/ndarray.h>
#include <nanobind/operators.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string_view>

#include "kiln/errors.h"
#include "kiln/ir.h"
#include "kiln/ops.h"
#include "src/python/bindings.h"

namespace kiln::python {

namespace {

bool has_float_slot(PyObject* o) {
  PyNumberMethods* nm = Py_TYPE(o)->tp_as_number;
  return nm && nm->nb_float;
}

int64_t to_int64(PyObject* o) {
  int64_t v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

double to_double(PyObject* o) {
  double v = PyFloat_AsDouble(o);
  if (v == -1.0 && PyErr_Occurred()) throw nb::python_error();
  return v;
}

bool is_int_like(PyObject* o) { return !PyBool_Check(o) && !PyFloat_Check(o) && PyIndex_Check(o); }

// One attribute value; see the file comment for the mapping.
AttrValue attr_from_python(const std::string& op, const std::string& key, nb::handle v) {
  PyObject* o = v.ptr();
  if (PyBool_Check(o)) return o == Py_True;
  if (nb::isinstance<DType>(v)) return nb::cast<DType>(v);
  if (is_int_like(o)) return to_int64(o);
  if (PyUnicode_Check(o)) return nb::cast<std::string>(v);
  if (PyFloat_Check(o) || (has_float_slot(o) && !PySequence_Check(o))) return to_double(o);
  if (PySequence_Check(o)) {
    nb::object fast = nb::steal(PySequence_Fast(o, "attribute"));
    if (!fast.is_valid()) throw nb::python_error();
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast.ptr());
    PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
    bool any_float = false;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* e = items[i];
      if (is_int_like(e)) continue;
      if (!PyBool_Check(e) && (PyFloat_Check(e) || has_float_slot(e)) && !PySequence_Check(e)) {
        any_float = true;
        continue;
      }
      KILN_FAIL(kInvalidArgument, op, ": attribute '", key, "' must be a list of ints or floats; item ", i,
                " is ", nb::inst_name(e).c_str());
    }
    if (!any_float) {
      std::vector<int64_t> ints(static_cast<size_t>(n));
      for (Py_ssize_t i = 0; i < n; ++i) ints[size_t(i)] = to_int64(items[i]);
      return ints;
    }
    std::vector<double> floats(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) floats[size_t(i)] = to_double(items[i]);
    return floats;
  }
  KILN_FAIL(kInvalidArgument, op, ": attribute '", key, "' has a value of type ", nb::inst_name(v).c_str(),
            "; expected bool, int, float, str, DType, or a list of ints or floats");
}

Attrs attrs_from_dict(const std::string& op, nb::handle obj) {
  Attrs attrs;
  if (obj.is_none()) return attrs;
  if (!PyDict_Check(obj.ptr()))
    KILN_FAIL(kInvalidArgument, op, ": attrs must be a dict, got ", nb::inst_name(obj).c_str());
  for (auto [k, v] : nb::borrow<nb::dict>(obj)) {
    if (!PyUnicode_Check(k.ptr()))
      KILN_FAIL(kInvalidArgument, op, ": attribute names must be str, got ", nb::inst_name(k).c_str());
    std::string key = nb::cast<std::string>(k);
    attrs.set(key, attr_from_python(op, key, v));
  }
  return attrs;
}

nb::dict attrs_to_dict(const Attrs& attrs) {
  nb::dict d;
  for (const auto& [k, v] : attrs.items())
    d[k.c_str()] = std::visit([](const auto& x) { return nb::cast(x); }, v);
  return d;
}

OpKind op_by_name(const std::string& name) {
  auto op = op_from_name(name);
  KILN_CHECK(op.has_value() && *op != OpKind::kCount, kInvalidArgument, "unknown op '", name,
             "'; kiln._C.op_names() lists the valid ones");
  return *op;
}

std::vector<ValueId> value_ids(const std::string& op, nb::handle seq) {
  if (!PySequence_Check(seq.ptr()))
    KILN_FAIL(kInvalidArgument, op, ": inputs must be a list of value ids (or None)");
  nb::object fast = nb::steal(PySequence_Fast(seq.ptr(), "inputs"));
  if (!fast.is_valid()) throw nb::python_error();
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast.ptr());
  PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
  std::vector<ValueId> ids(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (items[i] == Py_None) {
      ids[size_t(i)] = kNoValue;
      continue;
    }
    if (!is_int_like(items[i]))
      KILN_FAIL(kInvalidArgument, op, ": input ", i, " must be a value id or None, got ",
                nb::inst_name(items[i]).c_str());
    int64_t v = to_int64(items[i]);
    KILN_CHECK(v >= 0 && v <= INT32_MAX, kInvalidArgument, op, ": input ", i, " has invalid value id ", v);
    ids[size_t(i)] = ValueId(v);
  }
  return ids;
}

nb::list optional_ids(const std::vector<ValueId>& ids) {
  nb::list out;
  for (ValueId v : ids) out.append(v == kNoValue ? nb::object(nb::none()) : nb::object(nb::int_(v)));
  return out;
}

TensorType tensor_type(DType dtype, nb::handle shape) { return TensorType(dtype, shape_from_sequence(shape, "shape")); }

using ConstArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

}  // namespace

void bind_ir(nb::module_& m) {
  m.def("op_names", [] {
    std::vector<std::string> names;
    for (int i = 0; i < kNumOps; ++i) names.emplace_back(op_name(OpKind(i)));
    return names;
  }, "Every Kiln op, in the order of KILN_OP_LIST.");
  m.def("op_family", [](const std::string& name) {
    static const char* kFamilies[] = {"unary",  "binary", "where",  "cast",   "reduce", "softmax",   "norm",     "matmul",
                                      "conv",   "pool",   "shape",  "gather", "attention", "generator", "fused"};
    return std::string(kFamilies[size_t(op_info(op_by_name(name)).family)]);
  }, nb::arg("op"), "The family of an op ('unary', 'binary', ...), as in include/kiln/ops.h.");

  nb::class_<Dim>(m, "Dim", "One dimension: a concrete extent, optionally a symbol with a [min, max] range.")
      .def(nb::init<>())
      .def("__init__", [](Dim* d, int64_t extent, std::string symbol, int64_t min, int64_t max) {
        new (d) Dim{extent, std::move(symbol), min, max};
      }, nb::arg("extent"), nb::arg("symbol") = "", nb::arg("min") = 0, nb::arg("max") = 0)
      .def_rw("extent", &Dim::extent)
      .def_rw("symbol", &Dim::symbol)
      .def_rw("min", &Dim::min)
      .def_rw("max", &Dim::max)
      .def_prop_ro("is_static", &Dim::is_static)
      .def(nb::self == nb::self)
      .def("__repr__", [](const Dim& d) {
        return d.is_static() ? "Dim(" + std::to_string(d.extent) + ")"
                             : "Dim(" + std::to_string(d.extent) + ", '" + d.symbol + "', " + std::to_string(d.min) +
                                   ", " + std::to_string(d.max) + ")";
      });

  nb::class_<TensorType>(m, "TensorType", "A dtype and dims.")
      .def("__init__", [](TensorType* t, DType dtype, nb::handle shape) { new (t) TensorType(tensor_type(dtype, shape)); },
           nb::arg("dtype"), nb::arg("shape"),
           nb::sig("def __init__(self, dtype: DType, shape: collections.abc.Sequence[int]) -> None"))
      .def_static("from_dims", [](DType dtype, std::vector<Dim> dims) {
        TensorType t;
        t.dtype = dtype;
        t.dims = std::move(dims);
        return t;
      }, nb::arg("dtype"), nb::arg("dims"), "A type with symbolic dims.")
      .def_rw("dtype", &TensorType::dtype)
      .def_rw("dims", &TensorType::dims)
      .def_prop_ro("shape", &TensorType::shape)
      .def_prop_ro("rank", &TensorType::rank)
      .def_prop_ro("numel", &TensorType::numel)
      .def_prop_ro("nbytes", &TensorType::nbytes)
      .def(nb::self == nb::self)
      .def("__str__", &TensorType::to_string)
      .def("__repr__", [](const TensorType& t) { return "TensorType(" + t.to_string() + ")"; });

  nb::class_<Value>(m, "Value", "A snapshot of one value of a graph (Graph.value).")
      .def_ro("type", &Value::type)
      .def_ro("name", &Value::name)
      .def_ro("is_input", &Value::is_input)
      .def_ro("is_weight", &Value::is_weight)
      .def_prop_ro("is_constant", &Value::is_constant)
      .def("__repr__", [](const Value& v) { return "Value('" + v.name + "', " + v.type.to_string() + ")"; });

  nb::class_<Node>(m, "Node", "A view of one node; keeps its graph alive.")
      .def_prop_ro("op", [](const Node& n) { return std::string(op_name(n.op)); })
      .def_prop_ro("inputs", [](const Node& n) { return nb::typed<nb::list, std::optional<int>>(optional_ids(n.inputs)); },
                   "Input value ids; None for an absent optional input.")
      .def_ro("outputs", &Node::outputs)
      .def_prop_ro("attrs", [](const Node& n) { return nb::typed<nb::dict, nb::str, nb::object>(attrs_to_dict(n.attrs)); })
      .def_ro("name", &Node::name)
      .def_prop_ro("body", [](const Node& n) {
        return nb::typed<nb::object, std::optional<Graph>>(n.body ? nb::cast(n.body) : nb::none());
      }, "The body graph of a fused node, else None.")
      .def("__repr__", [](const Node& n) { return std::string("Node(") + op_name(n.op) + ")"; });

  nb::class_<Graph>(m, "Graph", "A Kiln IR graph: build it, then hand it to a Builder.")
      .def(nb::init<>())
      .def("copy", [](const Graph& g) { return Graph(g); }, "A deep copy (constant bytes are shared).")
      .def("__copy__", [](const Graph& g) { return Graph(g); })
      .def("__deepcopy__", [](const Graph& g, nb::handle) { return Graph(g); }, nb::arg("memo"))
      .def("add_input", [](Graph& g, const std::string& name, DType dtype, nb::handle shape) {
        return g.add_input(name, tensor_type(dtype, shape));
      }, nb::arg("name"), nb::arg("dtype"), nb::arg("shape"),
         nb::sig("def add_input(self, name: str, dtype: DType, shape: collections.abc.Sequence[int]) -> int"),
         "A runtime input; returns its value id.")
      .def("add_input", [](Graph& g, const std::string& name, const TensorType& type) { return g.add_input(name, type); },
           nb::arg("name"), nb::arg("type"), "A runtime input of a given (possibly symbolic) type.")
      .def("add_constant", [](Graph& g, const std::string& name, ConstArray a, bool weight) {
        std::string what = "constant '" + name + "'";
        std::vector<int64_t> shape(a.shape_ptr(), a.shape_ptr() + a.ndim());
        TensorType t(dtype_from_dlpack(a.dtype(), what), shape);
        return g.add_constant(name, t, a.data(), a.nbytes(), weight);
      }, nb::arg("name"), nb::arg("array"), nb::arg("weight") = false,
         "A constant copied from a CPU array (numpy, or anything exporting DLPack); weight=True marks a "
         "named, refittable model weight.")
      .def("add_constant_from_ptr", [](Graph& g, const std::string& name, DType dtype, nb::handle shape,
                                       nb::handle data_ptr, size_t nbytes, bool weight) {
        TensorType t = tensor_type(dtype, shape);
        KILN_CHECK(nbytes == t.nbytes(), kInvalidArgument, "constant '", name, "' of type ", t.to_string(), " needs ",
                   t.nbytes(), " bytes, got nbytes=", nbytes);
        const void* p = pointer_from_int(data_ptr, "data_ptr");
        KILN_CHECK(p != nullptr || nbytes == 0, kInvalidArgument, "constant '", name, "': data_ptr is null");
        return g.add_constant(name, t, p, nbytes, weight);
      }, nb::arg("name"), nb::arg("dtype"), nb::arg("shape"), nb::arg("data_ptr"), nb::arg("nbytes"),
         nb::arg("weight") = false,
         nb::sig("def add_constant_from_ptr(self, name: str, dtype: DType, shape: collections.abc.Sequence[int], "
                 "data_ptr: int, nbytes: int, weight: bool = False) -> int"),
         "A constant copied from host memory at data_ptr (e.g. a CPU torch tensor's data_ptr()).")
      .def("add_node", [](Graph& g, const std::string& op, nb::handle inputs, nb::handle attrs, const std::string& name) {
        OpKind kind = op_by_name(op);
        return g.add_node(kind, value_ids(op, inputs), attrs_from_dict(op, attrs), name);
      }, nb::arg("op"), nb::arg("inputs"), nb::arg("attrs") = nb::none(), nb::arg("name") = "",
         nb::sig("def add_node(self, op: str, inputs: collections.abc.Sequence[int | None], "
                 "attrs: collections.abc.Mapping[str, bool | int | float | str | DType | "
                 "collections.abc.Sequence[int] | collections.abc.Sequence[float]] | None = None, "
                 "name: str = '') -> list[int]"),
         "Appends a node running the op's shape rule; returns its output value ids.")
      .def("mark_output", &Graph::mark_output, nb::arg("value"), nb::arg("name"))
      .def("type", [](const Graph& g, ValueId v) {
        KILN_CHECK(v >= 0 && v < g.num_values(), kInvalidArgument, "value id ", v, " out of range (graph has ",
                   g.num_values(), " values)");
        return g.type(v);
      }, nb::arg("value"))
      .def("value", [](const Graph& g, ValueId v) {
        KILN_CHECK(v >= 0 && v < g.num_values(), kInvalidArgument, "value id ", v, " out of range (graph has ",
                   g.num_values(), " values)");
        return g.value(v);
      }, nb::arg("value"))
      .def_prop_ro("inputs", &Graph::inputs)
      .def_prop_ro("outputs", &Graph::outputs)
      .def("constants", &Graph::constants)
      .def_prop_ro("num_nodes", [](const Graph& g) { return g.nodes().size(); })
      .def_prop_ro("num_values", &Graph::num_values)
      .def_prop_ro("nodes", [](nb::handle self) {
        const Graph& g = nb::cast<const Graph&>(self);
        nb::typed<nb::list, Node> out{nb::list()};
        for (const auto& n : g.nodes())
          out.append(nb::cast(n.get(), nb::rv_policy::reference_internal, self));
        return out;
      }, "Views of the nodes, in topological order.")
      .def("verify", &Graph::verify)
      .def("to_string", &Graph::to_string)
      .def("__str__", &Graph::to_string);
}

}  // namespace kiln::python
