// Pointwise semantics that need no inlining into callers: attribute parsing, the run-time op
// switches, cast values, broadcasting, and the array loops of the CPU kernels.
//
// The array loops switch on the op once per call and run a loop specialised for that op and
// for the operand strides (both dense, one broadcast scalar, or general), which is what lets
// the compiler vectorize them.
#include "src/ops/pointwise.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace kiln::pw {

UnaryParams UnaryParams::from(OpKind op, const Attrs& a) {
  return read_attrs(op, [&] {
    UnaryParams p;
    if (op == OpKind::kGelu) {
      const std::string mode = a.get_string("approximate", "none");
      KILN_CHECK(mode == "none" || mode == "tanh", kInvalidArgument,
                 "attribute 'approximate' must be \"none\" or \"tanh\", got \"", mode, "\"");
      p.gelu_tanh = mode == "tanh";
    } else if (op == OpKind::kClamp) {
      if (a.has("min")) p.lo = a.get_float("min");
      if (a.has("max")) p.hi = a.get_float("max");
      KILN_CHECK(!std::isnan(p.lo) && !std::isnan(p.hi), kInvalidArgument, "clamp bounds must not be NaN");
    } else if (op == OpKind::kLeakyRelu) {
      p.slope = a.get_float("negative_slope", 0.01);
    }
    return p;
  });
}

template <typename T>
T apply_unary(OpKind op, T x, const UnaryParams& p) {
#define KILN_CASE(k) \
  case OpKind::k: return unary_value<OpKind::k>(x, p);
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      KILN_PW_UNARY_OPS(KILN_CASE)
      default: break;
    }
  } else {
    switch (op) {
      KILN_PW_UNARY_INT_OPS(KILN_CASE)
      default: break;
    }
  }
#undef KILN_CASE
  KILN_FAIL(kInvalidArgument, op_name(op), " is not a unary op on this element type");
}

template <typename T>
T apply_binary(OpKind op, T a, T b) {
#define KILN_CASE(k) \
  case OpKind::k: return binary_value<OpKind::k>(a, b);
  switch (op) {
    KILN_PW_ARITH_OPS(KILN_CASE)
    KILN_PW_COMPARE_OPS(KILN_CASE)
    case OpKind::kPow:
      if constexpr (std::is_floating_point_v<T>) return binary_value<OpKind::kPow>(a, b);
      break;
    default: break;
  }
#undef KILN_CASE
  KILN_FAIL(kInvalidArgument, op_name(op), " is not a binary op on this element type");
}

double wrap_integer(double v, DType to) {
  const int64_t i = to_int64_saturated(v);
  switch (to) {
    case DType::kI64: return static_cast<double>(i);
    case DType::kI32: return static_cast<int32_t>(i);
    case DType::kI8: return static_cast<int8_t>(i);
    case DType::kU8: return static_cast<uint8_t>(i);
    default: return v;
  }
}

double cast_value(double v, DType to) {
  switch (to) {
    case DType::kF32: return static_cast<float>(v);
    case DType::kF64: return v;
    case DType::kF16: return half_to_float(float_to_half(static_cast<float>(v)));
    case DType::kBF16: return bf16_to_float(float_to_bf16(static_cast<float>(v)));
    case DType::kBool: return v != 0.0 ? 1.0 : 0.0;
    default: return wrap_integer(v, to);
  }
}

// ---- broadcasting -----------------------------------------------------------------------

std::vector<Dim> broadcast_dims(OpKind op, const TensorType& a, const TensorType& b) {
  const size_t r = std::max(a.dims.size(), b.dims.size());
  std::vector<Dim> out(r);
  for (size_t i = 0; i < r; ++i) {
    const Dim* da = i < r - a.dims.size() ? nullptr : &a.dims[i - (r - a.dims.size())];
    const Dim* db = i < r - b.dims.size() ? nullptr : &b.dims[i - (r - b.dims.size())];
    if (!da || !db) {
      out[i] = da ? *da : *db;
    } else if (da->extent == db->extent) {
      out[i] = da->is_static() ? *db : *da;
    } else if (da->extent == 1) {
      out[i] = *db;
    } else if (db->extent == 1) {
      out[i] = *da;
    } else {
      KILN_FAIL(kShapeMismatch, op_name(op), ": shapes ", a.to_string(), " and ", b.to_string(),
                " do not broadcast (dim ", i, ": ", da->extent, " vs ", db->extent, ")");
    }
  }
  return out;
}

BroadcastPlan plan_broadcast(const std::vector<int64_t>& out, const std::vector<std::vector<int64_t>>& operands) {
  return plan_broadcast(out, operands, {});
}

BroadcastPlan plan_broadcast(const std::vector<int64_t>& out, const std::vector<std::vector<int64_t>>& operands,
                             const std::vector<std::vector<int64_t>>& strides) {
  const size_t r = out.size(), ops = operands.size();
  KILN_CHECK(ops <= 16, kUnsupported, "pointwise broadcast of ", ops, " operands (at most 16)");
  // Element strides of each operand along each output dim (0 where it broadcasts).
  std::vector<std::vector<int64_t>> full(ops, std::vector<int64_t>(r, 0));
  for (size_t k = 0; k < ops; ++k) {
    const auto& s = operands[k];
    KILN_CHECK(s.size() <= r, kInternal, "operand of rank ", s.size(), " broadcast to rank ", r);
    const bool given = k < strides.size() && !strides[k].empty();
    KILN_CHECK(!given || strides[k].size() == s.size(), kInternal, "operand of rank ", s.size(), " with ",
               strides[k].size(), " strides");
    int64_t stride = 1;
    for (size_t j = s.size(); j-- > 0;) {
      const size_t d = j + (r - s.size());
      KILN_CHECK(s[j] == out[d] || s[j] == 1, kInternal, "operand dim ", j, " (", s[j], ") does not broadcast to ",
                 out[d]);
      full[k][d] = s[j] == 1 ? 0 : given ? strides[k][j] : stride;
      stride *= s[j];
    }
  }
  BroadcastPlan plan;
  plan.strides.resize(ops);
  plan.numel = 1;
  for (size_t d = 0; d < r; ++d) {
    plan.numel *= out[d];
    if (out[d] == 1) continue;
    bool merge = !plan.shape.empty();
    for (size_t k = 0; k < ops && merge; ++k) merge = plan.strides[k].back() == full[k][d] * out[d];
    if (merge) {
      plan.shape.back() *= out[d];
      for (size_t k = 0; k < ops; ++k) plan.strides[k].back() = full[k][d];
    } else {
      plan.shape.push_back(out[d]);
      for (size_t k = 0; k < ops; ++k) plan.strides[k].push_back(full[k][d]);
    }
  }
  if (plan.shape.empty()) {
    plan.shape.push_back(1);
    for (auto& s : plan.strides) s.push_back(0);
  }
  KILN_CHECK(plan.shape.size() <= 16, kUnsupported, "pointwise broadcast over ", plan.shape.size(),
             " non-mergeable dims (at most 16)");
  return plan;
}

// ---- array forms --------------------------------------------------------------------------

namespace {

// y[i] = f(x[i]). The last n % 16 elements run through the same vector code, padded: scalar
// code may contract multiply-adds differently, and a value's result must not depend on its
// position in the tensor.
template <typename T, typename F>
void padded_loop(const T* x, T* y, int64_t n, F f) {
  constexpr int64_t kV = 16;
  const int64_t body = n - n % kV;
  for (int64_t i = 0; i < body; ++i) y[i] = f(x[i]);
  if (body < n) {
    T xt[kV] = {}, yt[kV];
    std::copy(x + body, x + n, xt);
    for (int64_t i = 0; i < kV; ++i) yt[i] = f(xt[i]);
    std::copy(yt, yt + (n - body), y + body);
  }
}

template <OpKind K, typename T>
void unary_loop(const UnaryParams& params, const T* x, T* y, int64_t n) {
  const UnaryParams p = params;  // a local copy: stores to y cannot alias it
  if constexpr (K == OpKind::kClamp && !std::is_floating_point_v<T>) {
    const T lo = int_bound<T>(p.lo, true), hi = int_bound<T>(p.hi, false);
    for (int64_t i = 0; i < n; ++i) {
      const T t = x[i] < lo ? lo : x[i];
      y[i] = t > hi ? hi : t;
    }
  } else if constexpr (K == OpKind::kGelu) {  // one loop per form, each with no branch inside
    if (p.gelu_tanh) padded_loop<T>(x, y, n, [](T v) { return gelu_value<true>(v); });
    else padded_loop<T>(x, y, n, [](T v) { return gelu_value<false>(v); });
  } else if constexpr (std::is_floating_point_v<T>) {
    padded_loop<T>(x, y, n, [&p](T v) { return unary_value<K>(v, p); });
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = unary_value<K>(x[i], p);
  }
}

// Exponents with an exact (or correctly rounded) cheaper form than pow.
template <typename T>
bool pow_by_constant(const T* a, int64_t sa, T e, T* y, int64_t n) {
  if (sa != 1) return false;
  if (e == T(1)) {
    for (int64_t i = 0; i < n; ++i) y[i] = a[i];
  } else if (e == T(2)) {
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] * a[i];
  } else if (e == T(0.5)) {  // pow(-0, .5) = +0 and pow(-inf, .5) = inf, unlike sqrt
    const T inf = std::numeric_limits<T>::infinity();
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] == -inf ? inf : std::sqrt(a[i]) + T(0);
  } else {
    return false;
  }
  return true;
}

template <OpKind K, typename T, typename O>
void binary_loop(const T* a, int64_t sa, const T* b, int64_t sb, O* y, int64_t n) {
  if constexpr (K == OpKind::kPow)
    if (sb == 0 && pow_by_constant(a, sa, *b, y, n)) return;
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<O>(binary_value<K>(a[i], b[i]));
  } else if (sa == 1 && sb == 0) {
    const T bv = *b;
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<O>(binary_value<K>(a[i], bv));
  } else if (sa == 0 && sb == 1) {
    const T av = *a;
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<O>(binary_value<K>(av, b[i]));
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<O>(binary_value<K>(a[i * sa], b[i * sb]));
  }
}

}  // namespace

template <typename T>
void unary_array(OpKind op, const UnaryParams& p, const T* x, T* y, int64_t n) {
#define KILN_CASE(k) \
  case OpKind::k: return unary_loop<OpKind::k>(p, x, y, n);
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      KILN_PW_UNARY_OPS(KILN_CASE)
      default: break;
    }
  } else {
    switch (op) {
      KILN_PW_UNARY_INT_OPS(KILN_CASE)
      default: break;
    }
  }
#undef KILN_CASE
  KILN_FAIL(kInvalidArgument, op_name(op), " is not a unary op on this element type");
}

template <typename T>
void binary_array(OpKind op, const T* a, int64_t sa, const T* b, int64_t sb, T* y, int64_t n) {
#define KILN_CASE(k) \
  case OpKind::k: return binary_loop<OpKind::k, T, T>(a, sa, b, sb, y, n);
  switch (op) {
    KILN_PW_ARITH_OPS(KILN_CASE)
    case OpKind::kPow:
      if constexpr (std::is_floating_point_v<T>) return binary_loop<OpKind::kPow, T, T>(a, sa, b, sb, y, n);
      break;
    default: break;
  }
#undef KILN_CASE
  KILN_FAIL(kInvalidArgument, op_name(op), " is not an arithmetic op on this element type");
}

template <typename T>
void compare_array(OpKind op, const T* a, int64_t sa, const T* b, int64_t sb, uint8_t* y, int64_t n) {
#define KILN_CASE(k) \
  case OpKind::k: return binary_loop<OpKind::k, T, uint8_t>(a, sa, b, sb, y, n);
  switch (op) {
    KILN_PW_COMPARE_OPS(KILN_CASE)
    default: break;
  }
#undef KILN_CASE
  KILN_FAIL(kInvalidArgument, op_name(op), " is not a comparison or logical op");
}

namespace {

// A fold with vector extensions: an element-wise vector select is what lets the compiler use
// vector max / min instructions here (a scalar fold with NaN checks stays scalar).
template <typename T, bool Max>
T extreme_array(const T* x, int64_t n) {
  typedef T V __attribute__((vector_size(64)));
  constexpr int64_t kL = int64_t(sizeof(V) / sizeof(T));
  const T init = Max ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
  auto pick = [](T a, T v) { return (is_nan(v) || (Max ? v > a : v < a)) ? v : a; };
  V acc = V{} + init;
  int64_t i = 0;
  for (; i + kL <= n; i += kL) {
    V v;
    std::memcpy(&v, x + i, sizeof(V));
    acc = ((Max ? v > acc : v < acc) | (v != v)) ? v : acc;
  }
  T m = init;
  for (int64_t l = 0; l < kL; ++l) m = pick(m, acc[l]);
  for (; i < n; ++i) m = pick(m, x[i]);
  return m;
}

}  // namespace

template <typename T>
T max_array(const T* x, int64_t n) {
  return extreme_array<T, true>(x, n);
}
template <typename T>
T min_array(const T* x, int64_t n) {
  return extreme_array<T, false>(x, n);
}
template float max_array<float>(const float*, int64_t);
template double max_array<double>(const double*, int64_t);
template float min_array<float>(const float*, int64_t);
template double min_array<double>(const double*, int64_t);

#define KILN_INSTANTIATE(T)                                                                        \
  template T apply_unary<T>(OpKind, T, const UnaryParams&);                                        \
  template T apply_binary<T>(OpKind, T, T);                                                        \
  template void unary_array<T>(OpKind, const UnaryParams&, const T*, T*, int64_t);                 \
  template void binary_array<T>(OpKind, const T*, int64_t, const T*, int64_t, T*, int64_t);        \
  template void compare_array<T>(OpKind, const T*, int64_t, const T*, int64_t, uint8_t*, int64_t);
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
KILN_INSTANTIATE(int64_t)
KILN_INSTANTIATE(int32_t)
KILN_INSTANTIATE(int8_t)
KILN_INSTANTIATE(uint8_t)
#undef KILN_INSTANTIATE

std::vector<char> gather_only_inputs(const Graph& body) {
  std::vector<char> other(size_t(body.num_values()), 0), gather(size_t(body.num_values()), 0);
  for (const auto& node : body.nodes())
    for (ValueId v : node->inputs)
      if (v >= 0) (node->op == OpKind::kIndexSelect ? gather : other)[size_t(v)] = 1;
  for (ValueId v : body.outputs())
    if (v >= 0) other[size_t(v)] = 1;
  std::vector<char> only;
  for (ValueId v : body.inputs()) only.push_back(gather[size_t(v)] && !other[size_t(v)]);
  return only;
}

int input_position(const Graph& body, ValueId v) {
  const auto& ins = body.inputs();
  const auto it = std::find(ins.begin(), ins.end(), v);
  return it == ins.end() ? -1 : int(it - ins.begin());
}

std::vector<int64_t> gathered_shape(const Graph& body, const Node& gather) {
  for (const auto& node : body.nodes())
    if (node->op == OpKind::kReshape && node->inputs[0] == gather.outputs[0])
      return body.type(node->outputs[0]).shape();
  return body.type(gather.outputs[0]).shape();
}

std::optional<ConcatBody> concat_body(const Graph& body) {
  if (body.outputs().size() != 1) return std::nullopt;
  const Node* c = body.value(body.outputs()[0]).producer;
  if (c == nullptr || c->op != OpKind::kConcat) return std::nullopt;
  ConcatBody cb;
  const std::vector<int64_t> out = body.type(c->outputs[0]).shape();
  cb.axis = c->attrs.get_int("axis");
  if (cb.axis < 0) cb.axis += int64_t(out.size());
  cb.parts = c->inputs;
  cb.part_of.assign(size_t(body.num_values()), -1);
  cb.start.push_back(0);
  for (size_t k = 0; k < cb.parts.size(); ++k) {
    cb.shape.push_back(out);
    cb.shape.back()[size_t(cb.axis)] = body.type(cb.parts[k]).dims[size_t(cb.axis)].extent;
    cb.start.push_back(cb.start.back() + cb.shape.back()[size_t(cb.axis)]);
    // Every value the part is computed from, back through the producers.
    std::vector<ValueId> todo{cb.parts[k]};
    while (!todo.empty()) {
      const ValueId v = todo.back();
      todo.pop_back();
      if (body.value(v).is_constant()) continue;
      int& mark = cb.part_of[size_t(v)];
      if (mark == int(k)) continue;
      KILN_CHECK(mark < 0, kUnsupported, "fused_pointwise: body value ", v, " feeds two parts of its concat");
      mark = int(k);
      if (const Node* p = body.value(v).producer) todo.insert(todo.end(), p->inputs.begin(), p->inputs.end());
    }
  }
  return cb;
}

}  // namespace kiln::pw
