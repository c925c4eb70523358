// NodeArgs (argument reading) and ImportContext (node emission); see import_context.h.
#include "src/import/import_context.h"

#include <cmath>
#include <cstring>

namespace kiln::aten {

namespace {

const char* kind_name(ImportArg::Kind k) {
  switch (k) {
    case ImportArg::Kind::kNone: return "None";
    case ImportArg::Kind::kBool: return "bool";
    case ImportArg::Kind::kInt: return "int";
    case ImportArg::Kind::kFloat: return "float";
    case ImportArg::Kind::kString: return "str";
    case ImportArg::Kind::kDType: return "dtype";
    case ImportArg::Kind::kTensor: return "Tensor";
    case ImportArg::Kind::kList: return "list";
  }
  return "?";
}

[[noreturn]] void wrong_kind(std::string_view name, const ImportArg& a, const char* expected) {
  reject("argument '", name, "' is ", kind_name(a.kind), ", expected ", expected);
}

int64_t int_of(std::string_view name, const ImportArg& a) {
  if (a.kind == ImportArg::Kind::kInt) return a.i;
  if (a.kind == ImportArg::Kind::kBool) return a.b ? 1 : 0;
  wrong_kind(name, a, "int");
}

}  // namespace

// --- NodeArgs -------------------------------------------------------------------------

const ImportArg* NodeArgs::find(size_t pos, std::string_view name) const {
  if (pos != kKwOnly && pos < node_.args.size()) return &node_.args[pos];
  for (const auto& [key, value] : node_.kwargs)
    if (key == name) return &value;
  return nullptr;
}

bool NodeArgs::given(size_t pos, std::string_view name) const {
  const ImportArg* a = find(pos, name);
  return a != nullptr && a->kind != ImportArg::Kind::kNone;
}

int64_t NodeArgs::get_int(size_t pos, std::string_view name) const {
  const ImportArg* a = find(pos, name);
  if (!a || a->kind == ImportArg::Kind::kNone) reject("missing argument '", name, "'");
  return int_of(name, *a);
}

int64_t NodeArgs::get_int(size_t pos, std::string_view name, int64_t fallback) const {
  return given(pos, name) ? get_int(pos, name) : fallback;
}

bool NodeArgs::get_bool(size_t pos, std::string_view name, bool fallback) const {
  if (!given(pos, name)) return fallback;
  const ImportArg& a = *find(pos, name);
  if (a.kind == ImportArg::Kind::kBool) return a.b;
  if (a.kind == ImportArg::Kind::kInt) return a.i != 0;
  wrong_kind(name, a, "bool");
}

const ImportArg& NodeArgs::get_scalar(size_t pos, std::string_view name) const {
  const ImportArg* a = find(pos, name);
  if (!a || a->kind == ImportArg::Kind::kNone) reject("missing argument '", name, "'");
  if (a->kind != ImportArg::Kind::kBool && a->kind != ImportArg::Kind::kInt && a->kind != ImportArg::Kind::kFloat)
    wrong_kind(name, *a, "a number");
  return *a;
}

double NodeArgs::get_float(size_t pos, std::string_view name) const {
  const ImportArg& a = get_scalar(pos, name);
  if (a.kind == ImportArg::Kind::kFloat) return a.f;
  if (a.kind == ImportArg::Kind::kInt) return double(a.i);
  return a.b ? 1.0 : 0.0;
}

double NodeArgs::get_float(size_t pos, std::string_view name, double fallback) const {
  return given(pos, name) ? get_float(pos, name) : fallback;
}

std::vector<int64_t> NodeArgs::get_ints(size_t pos, std::string_view name) const {
  const ImportArg* a = find(pos, name);
  if (!a || a->kind == ImportArg::Kind::kNone) reject("missing argument '", name, "'");
  if (a->kind == ImportArg::Kind::kInt) return {a->i};
  if (a->kind != ImportArg::Kind::kList) wrong_kind(name, *a, "int[]");
  std::vector<int64_t> out;
  out.reserve(a->list.size());
  for (const ImportArg& e : a->list) out.push_back(int_of(name, e));
  return out;
}

std::vector<int64_t> NodeArgs::get_ints(size_t pos, std::string_view name,
                                        const std::vector<int64_t>& fallback) const {
  return given(pos, name) ? get_ints(pos, name) : fallback;
}

std::string NodeArgs::get_string(size_t pos, std::string_view name, const std::string& fallback) const {
  if (!given(pos, name)) return fallback;
  const ImportArg& a = *find(pos, name);
  if (a.kind != ImportArg::Kind::kString) wrong_kind(name, a, "str");
  return a.s;
}

std::optional<DType> NodeArgs::get_dtype(size_t pos, std::string_view name) const {
  if (!given(pos, name)) return std::nullopt;
  const ImportArg& a = *find(pos, name);
  if (a.kind != ImportArg::Kind::kDType) wrong_kind(name, a, "dtype");
  return a.dtype;
}

const ImportTensor& NodeArgs::tensor(int32_t id) const {
  if (id < 0 || size_t(id) >= graph_.tensors.size())
    reject("tensor id ", id, " out of range (", graph_.tensors.size(), " tensors)");
  return graph_.tensors[size_t(id)];
}

int32_t NodeArgs::tensor_id(size_t pos, std::string_view name) const {
  const ImportArg* a = find(pos, name);
  if (!a || a->kind == ImportArg::Kind::kNone) reject("missing tensor argument '", name, "'");
  if (a->kind != ImportArg::Kind::kTensor) wrong_kind(name, *a, "Tensor");
  tensor(a->tensor);
  return a->tensor;
}

std::optional<int32_t> NodeArgs::opt_tensor_id(size_t pos, std::string_view name) const {
  if (!given(pos, name)) return std::nullopt;
  return tensor_id(pos, name);
}

std::vector<int32_t> NodeArgs::tensor_list(size_t pos, std::string_view name) const {
  const ImportArg* a = find(pos, name);
  if (!a || a->kind == ImportArg::Kind::kNone) reject("missing argument '", name, "'");
  if (a->kind != ImportArg::Kind::kList) wrong_kind(name, *a, "Tensor[]");
  std::vector<int32_t> ids;
  for (const ImportArg& e : a->list) {
    if (e.kind == ImportArg::Kind::kNone) {
      ids.push_back(-1);
      continue;
    }
    if (e.kind != ImportArg::Kind::kTensor) wrong_kind(name, e, "Tensor (as a list entry)");
    tensor(e.tensor);
    ids.push_back(e.tensor);
  }
  return ids;
}

const ImportTensor& NodeArgs::out(size_t i) const {
  if (!out_used(i)) reject("output ", i, " has no tensor id");
  return tensor(node_.outputs[i]);
}

void NodeArgs::require_unused(size_t i, std::string_view what) const {
  if (out_used(i)) reject("output ", i, " (", what, ") is used; Kiln does not compute it");
}

void NodeArgs::require_unused_from(size_t from, std::string_view what) const {
  for (size_t i = from; i < node_.outputs.size(); ++i) require_unused(i, what);
}

// --- ImportContext --------------------------------------------------------------------

ValueId ImportContext::value(int32_t id) const {
  KILN_CHECK(id >= 0 && size_t(id) < values_.size() && values_[size_t(id)] != kNoValue, kInvalidArgument,
             "tensor ", id, " is used before it is defined");
  return values_[size_t(id)];
}

std::optional<ValueId> ImportContext::opt_input(size_t pos, std::string_view name) const {
  auto id = args.opt_tensor_id(pos, name);
  if (!id) return std::nullopt;
  return value(*id);
}

ValueId ImportContext::add(OpKind op, const std::vector<ValueId>& inputs, const Attrs& attrs) {
  return graph.add_node1(op, inputs, attrs, args.node().name);
}

std::vector<ValueId> ImportContext::add_multi(OpKind op, const std::vector<ValueId>& inputs, const Attrs& attrs) {
  return graph.add_node(op, inputs, attrs, args.node().name);
}

ValueId ImportContext::cast(ValueId v, DType dt) {
  if (type(v).dtype == dt) return v;
  Attrs a;
  a.set("dtype", dt);
  return add(OpKind::kCast, {v}, a);
}

ValueId ImportContext::reshape(ValueId v, const std::vector<int64_t>& shape) {
  if (type(v).shape() == shape) return v;
  Attrs a;
  a.set("shape", shape);
  return add(OpKind::kReshape, {v}, a);
}

ValueId ImportContext::permute(ValueId v, const std::vector<int64_t>& perm) {
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == int64_t(i);
  if (identity && int64_t(perm.size()) == type(v).rank()) return v;
  Attrs a;
  a.set("perm", perm);
  return add(OpKind::kPermute, {v}, a);
}

ValueId ImportContext::scalar(const ImportArg& s, DType dt) {
  if (s.kind == ImportArg::Kind::kInt && is_integral(dt)) {
    Bytes b(dtype_size(dt));
    switch (dt) {
      case DType::kI64: { int64_t x = s.i; std::memcpy(b.data(), &x, 8); break; }
      case DType::kI32: { int32_t x = int32_t(s.i); std::memcpy(b.data(), &x, 4); break; }
      case DType::kI8: b[0] = uint8_t(int8_t(s.i)); break;
      default: b[0] = uint8_t(s.i); break;
    }
    return graph.add_constant("", TensorType(dt, {}), b.data(), b.size());
  }
  if (s.kind == ImportArg::Kind::kFloat) return scalar(s.f, dt);
  if (s.kind == ImportArg::Kind::kInt) return scalar(double(s.i), dt);
  return scalar(s.b ? 1.0 : 0.0, dt);
}

ValueId ImportContext::scalar(double v, DType dt) {
  Bytes b(dtype_size(dt));
  // Integral casts of non-finite or out-of-range values are undefined in C++: saturate instead.
  auto to_int = [&](double lo, double hi) -> int64_t {
    if (std::isnan(v)) return 0;
    return int64_t(std::trunc(std::fmin(std::fmax(v, lo), hi)));
  };
  switch (dt) {
    case DType::kF32: { float x = float(v); std::memcpy(b.data(), &x, 4); break; }
    case DType::kF64: std::memcpy(b.data(), &v, 8); break;
    case DType::kF16: { uint16_t x = float_to_half(float(v)); std::memcpy(b.data(), &x, 2); break; }
    case DType::kBF16: { uint16_t x = float_to_bf16(float(v)); std::memcpy(b.data(), &x, 2); break; }
    case DType::kI64: {
      int64_t x = to_int(-9.2233720368547758e18, 9.2233720368547748e18);
      std::memcpy(b.data(), &x, 8);
      break;
    }
    case DType::kI32: {
      int32_t x = int32_t(to_int(-2147483648.0, 2147483647.0));
      std::memcpy(b.data(), &x, 4);
      break;
    }
    case DType::kI8: b[0] = uint8_t(int8_t(to_int(-128.0, 127.0))); break;
    case DType::kU8: b[0] = uint8_t(to_int(0.0, 255.0)); break;
    case DType::kBool: b[0] = v != 0.0 ? 1 : 0; break;
  }
  return graph.add_constant("", TensorType(dt, {}), b.data(), b.size());
}

ValueId ImportContext::index_constant(const std::vector<int64_t>& values) {
  return graph.add_constant("", TensorType(DType::kI64, {int64_t(values.size())}), values.data(),
                            values.size() * sizeof(int64_t));
}

ValueId ImportContext::scale(ValueId v, const ImportArg& factor) {
  const bool one = (factor.kind == ImportArg::Kind::kInt && factor.i == 1) ||
                   (factor.kind == ImportArg::Kind::kFloat && factor.f == 1.0) ||
                   (factor.kind == ImportArg::Kind::kBool && factor.b);
  if (one) return v;
  return add(OpKind::kMul, {v, scalar(factor, type(v).dtype)});
}

}  // namespace kiln::aten
