// Graph::to_string: the stable text form used by golden pass tests and debug logs.
//
//   graph(%0 "x": f32[1,3,8,8]) {
//     %1 "conv.weight": f32[4,3,3,3] = weight
//     %2: f32[] = constant 0.5
//     %3: f32[1,4,8,8] = conv(%0, %1, _) {dilation=[1,1], groups=1, padding=[1,1], stride=[1,1]}
//     return %3 "out"
//   }
//
// Values are numbered by id; absent optional inputs print as "_"; attributes print sorted by
// key; a scalar constant prints its value; a fused node prints its body indented below it.
#include <cstring>
#include <iomanip>
#include <sstream>

#include "kiln/ir.h"

namespace kiln {

namespace {

std::string scalar_text(const Value& v) {
  const uint8_t* p = v.data->data();
  std::ostringstream os;
  os << std::setprecision(9);
  switch (v.type.dtype) {
    case DType::kF32: { float x; std::memcpy(&x, p, 4); os << x; break; }
    case DType::kF64: { double x; std::memcpy(&x, p, 8); os << x; break; }
    case DType::kF16: { uint16_t x; std::memcpy(&x, p, 2); os << half_to_float(x); break; }
    case DType::kBF16: { uint16_t x; std::memcpy(&x, p, 2); os << bf16_to_float(x); break; }
    case DType::kI64: { int64_t x; std::memcpy(&x, p, 8); os << x; break; }
    case DType::kI32: { int32_t x; std::memcpy(&x, p, 4); os << x; break; }
    case DType::kI8: { os << int(int8_t(p[0])); break; }
    case DType::kU8: { os << int(p[0]); break; }
    case DType::kBool: { os << (p[0] ? "true" : "false"); break; }
  }
  return os.str();
}

struct AttrPrinter {
  std::ostream& os;
  void operator()(bool b) const { os << (b ? "true" : "false"); }
  void operator()(int64_t i) const { os << i; }
  void operator()(double d) const { os << std::setprecision(9) << d; }
  void operator()(const std::string& s) const { os << '"' << s << '"'; }
  void operator()(DType t) const { os << dtype_name(t); }
  void operator()(const std::vector<int64_t>& v) const {
    os << "[";
    for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
    os << "]";
  }
  void operator()(const std::vector<double>& v) const {
    os << "[" << std::setprecision(9);
    for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
    os << "]";
  }
};

std::string value_ref(ValueId v) {
  if (v == kNoValue) return "_";
  std::string s = "%";
  return s += std::to_string(v);
}

std::string value_decl(const Graph& g, ValueId v) {
  const Value& val = g.value(v);
  std::string s = value_ref(v);
  if (!val.name.empty() && (val.is_input || val.is_weight)) s += " \"" + val.name + "\"";
  return s + ": " + val.type.to_string();
}

void print(const Graph& g, std::ostream& os, const std::string& indent) {
  os << "graph(";
  for (size_t i = 0; i < g.inputs().size(); ++i) os << (i ? ", " : "") << value_decl(g, g.inputs()[i]);
  os << ") {\n";
  for (ValueId c : g.constants()) {
    const Value& v = g.value(c);
    os << indent << "  " << value_decl(g, c) << " = ";
    if (v.is_weight)
      os << "weight\n";
    else if (v.type.numel() == 1)
      os << "constant " << scalar_text(v) << "\n";
    else
      os << "constant\n";
  }
  for (const auto& n : g.nodes()) {
    os << indent << "  ";
    for (size_t i = 0; i < n->outputs.size(); ++i) os << (i ? ", " : "") << value_decl(g, n->outputs[i]);
    os << " = " << op_name(n->op) << "(";
    for (size_t i = 0; i < n->inputs.size(); ++i) os << (i ? ", " : "") << value_ref(n->inputs[i]);
    os << ")";
    if (!n->attrs.items().empty()) {
      os << " {";
      bool first = true;
      for (const auto& [k, v] : n->attrs.items()) {
        os << (first ? "" : ", ") << k << "=";
        std::visit(AttrPrinter{os}, v);
        first = false;
      }
      os << "}";
    }
    if (n->body) {
      os << " ";
      print(*n->body, os, indent + "  ");
    } else {
      os << "\n";
    }
  }
  os << indent << "  return ";
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    ValueId o = g.outputs()[i];
    os << (i ? ", " : "") << value_ref(o);
    if (!g.value(o).name.empty()) os << " \"" << g.value(o).name << "\"";
  }
  os << "\n" << indent << "}\n";
}

}  // namespace

std::string Graph::to_string() const {
  std::ostringstream os;
  print(*this, os, "");
  return os.str();
}

}  // namespace kiln
