// The elementwise op families (unary, binary, where, cast), reductions, softmax, the
// normalizations and fused_pointwise: shape rules on good and bad inputs, and the CPU kernels
// against naive references written here (double math, explicit index arithmetic) on random
// inputs, over several shapes (broadcasts, 0-d scalars, odd and large sizes) and dtypes.
//
// Each kernel test builds a one-node graph, asks the CPU backend for the node's kernel and runs
// it directly, with workspace and output pre-filled with 0xFF bytes (NaN for floats) so that a
// kernel reading scratch it never wrote, or leaving output unwritten, shows up as a mismatch.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <thread>

#include "kiln/kiln.h"
#include "src/ops/shape_rules.h"
#include "tests/cpp/error_test_util.h"

namespace {

using namespace kiln;
using Shape = std::vector<int64_t>;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- tensors ------------------------------------------------------------------------------

// Values as doubles (exact for every dtype used here: test integers stay below 2^53).
struct Tensor {
  TensorType type;
  std::vector<double> v;
  bool constant = false;
  bool absent = false;
};

double round_to(double x, DType dt) {
  switch (dt) {
    case DType::kF32: return float(x);
    case DType::kF16: return half_to_float(float_to_half(float(x)));
    case DType::kBF16: return bf16_to_float(float_to_bf16(float(x)));
    default: return x;
  }
}

Bytes encode(const std::vector<double>& v, DType dt) {
  Bytes b(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    uint8_t* p = b.data() + i * dtype_size(dt);
    auto put = [&](auto x) { std::memcpy(p, &x, sizeof(x)); };
    switch (dt) {
      case DType::kF32: put(float(v[i])); break;
      case DType::kF64: put(v[i]); break;
      case DType::kF16: put(float_to_half(float(v[i]))); break;
      case DType::kBF16: put(float_to_bf16(float(v[i]))); break;
      case DType::kI64: put(int64_t(v[i])); break;
      case DType::kI32: put(int32_t(v[i])); break;
      case DType::kI8: put(int8_t(v[i])); break;
      case DType::kU8: put(uint8_t(v[i])); break;
      case DType::kBool: put(uint8_t(v[i] != 0)); break;
    }
  }
  return b;
}

std::vector<double> decode(const uint8_t* p, DType dt, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* q = p + i * int64_t(dtype_size(dt));
    auto get = [&](auto x) {
      std::memcpy(&x, q, sizeof(x));
      return x;
    };
    switch (dt) {
      case DType::kF32: v[i] = get(float{}); break;
      case DType::kF64: v[i] = get(double{}); break;
      case DType::kF16: v[i] = half_to_float(get(uint16_t{})); break;
      case DType::kBF16: v[i] = bf16_to_float(get(uint16_t{})); break;
      case DType::kI64: v[i] = double(get(int64_t{})); break;
      case DType::kI32: v[i] = get(int32_t{}); break;
      case DType::kI8: v[i] = get(int8_t{}); break;
      case DType::kU8: v[i] = get(uint8_t{}); break;
      case DType::kBool: {
        uint8_t x = get(uint8_t{});
        EXPECT_LE(x, 1) << "a bool output byte is neither 0 nor 1";
        v[i] = x;
        break;
      }
    }
  }
  return v;
}

// Random values in [lo, hi), rounded to what dtype holds (integers: whole numbers).
Tensor rand_t(DType dt, const Shape& shape, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  Tensor t;
  t.type = TensorType(dt, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  t.v.resize(size_t(t.type.numel()));
  for (double& x : t.v) {
    x = d(rng);
    if (is_integral(dt)) x = std::floor(x);
    if (dt == DType::kBool) x = x > (lo + hi) / 2 ? 1 : 0;
    x = round_to(x, dt);
  }
  return t;
}

Tensor from_values(DType dt, const Shape& shape, std::vector<double> v) {
  Tensor t;
  t.type = TensorType(dt, shape);
  for (double& x : v) x = round_to(x, dt);
  t.v = std::move(v);
  EXPECT_EQ(int64_t(t.v.size()), t.type.numel());
  return t;
}

Tensor none() {
  Tensor t;
  t.absent = true;
  return t;
}

std::string nm(const char* prefix, size_t i) {
  std::string s(prefix);
  s += std::to_string(i);
  return s;
}

struct Result {
  TensorType type;
  std::vector<double> v;
  std::string desc;
};

// Runs `kernel` once on the given buffers, with poisoned workspace and outputs.
std::vector<Bytes> run_kernel(const Kernel& kernel, const std::vector<const void*>& in,
                              const std::vector<TensorType>& out_types) {
  const size_t ws_size = kernel.workspace_size();
  std::vector<uint8_t> ws(ws_size + 64, 0xFF);
  void* ws_ptr = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 63) & ~uintptr_t(63));
  std::vector<Bytes> outs;
  std::vector<void*> out_ptrs;
  for (const auto& t : out_types) outs.emplace_back(t.nbytes() + 1, 0xFF);
  for (auto& o : outs) out_ptrs.push_back(o.data());
  RunContext ctx;
  ctx.workspace = ws_size ? ws_ptr : nullptr;
  ctx.workspace_size = ws_size;
  kernel.run(in.data(), out_ptrs.data(), ctx);
  for (auto& o : outs) EXPECT_EQ(o.back(), 0xFF) << "kernel wrote past its output";
  return outs;
}

// Builds a one-node graph (inputs or constants), makes its CPU kernel and runs it once.
Result run_op(OpKind op, const std::vector<Tensor>& ins, const Attrs& attrs = {}) {
  Graph g;
  std::vector<ValueId> ids;
  std::vector<Bytes> bufs;
  for (size_t i = 0; i < ins.size(); ++i) {
    bufs.push_back(ins[i].absent ? Bytes{} : encode(ins[i].v, ins[i].type.dtype));
    if (ins[i].absent) {
      ids.push_back(kNoValue);
      continue;
    }
    const std::string name = nm("t", i);
    ids.push_back(ins[i].constant ? g.add_constant(name, ins[i].type, bufs[i].data(), bufs[i].size())
                                  : g.add_input(name, ins[i].type));
  }
  const ValueId y = g.add_node1(op, ids, attrs);
  auto kernel = get_backend(Device{}).make_kernel(*g.nodes().back(), g, {});
  std::vector<const void*> in;
  for (size_t i = 0; i < ins.size(); ++i)
    in.push_back(ins[i].absent ? nullptr : ins[i].constant ? g.value(ids[i]).data->data() : bufs[i].data());
  auto outs = run_kernel(*kernel, in, {g.type(y)});
  return {g.type(y), decode(outs[0].data(), g.type(y).dtype, g.type(y).numel()), kernel->describe()};
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol, double atol,
                  const std::string& what = "") {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = atol + rtol * std::abs(want[i]);
    const bool same_nan = std::isnan(want[i]) && std::isnan(got[i]);
    const bool same_inf = std::isinf(want[i]) && got[i] == want[i];
    if (!same_nan && !same_inf && !(std::abs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << ", want " << want[i];
      if (++bad == 5) return;
    }
  }
}

double rtol_for(DType dt) {
  switch (dt) {
    case DType::kF32: return 1e-5;
    case DType::kF64: return 1e-12;
    case DType::kF16: return 2e-3;
    case DType::kBF16: return 1.6e-2;
    default: return 0;
  }
}
double atol_for(DType dt) { return dt == DType::kF16 ? 1e-3 : dt == DType::kBF16 ? 1e-2 : dt == DType::kF32 ? 1e-6 : 0; }

using kiln::test::expect_error;

std::vector<TensorType> infer(OpKind op, const std::vector<TensorType>& types, const Attrs& a = {}) {
  std::vector<const TensorType*> ptrs;
  for (const auto& t : types) ptrs.push_back(&t);
  return infer_types(op, ptrs, a);
}

TensorType tt(DType dt, const Shape& s) { return TensorType(dt, s); }


// ---- index helpers for references ---------------------------------------------------------

int64_t prod(const Shape& s) {
  int64_t p = 1;
  for (int64_t e : s) p *= e;
  return p;
}

Shape unravel(int64_t i, const Shape& shape) {
  Shape idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) idx[d] = i % shape[d], i /= shape[d];
  return idx;
}

// Linear index into `shape` of output multi-index `idx` under right-aligned broadcasting.
int64_t bcast_index(const Shape& idx, const Shape& shape) {
  int64_t lin = 0;
  const size_t off = idx.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) lin = lin * shape[d] + (shape[d] == 1 ? 0 : idx[off + d]);
  return lin;
}

Shape bcast_shape(const Shape& a, const Shape& b) {
  Shape o(std::max(a.size(), b.size()), 1);
  for (size_t i = 0; i < o.size(); ++i) {
    int64_t da = i < o.size() - a.size() ? 1 : a[i - (o.size() - a.size())];
    int64_t db = i < o.size() - b.size() ? 1 : b[i - (o.size() - b.size())];
    o[i] = da == 1 ? db : da;
  }
  return o;
}

// out[i] = f(a[..], b[..]) under broadcasting.
std::vector<double> ref_binary(const Tensor& a, const Tensor& b, const std::function<double(double, double)>& f) {
  const Shape as = a.type.shape(), bs = b.type.shape(), os = bcast_shape(as, bs);
  std::vector<double> y(size_t(prod(os)));
  for (int64_t i = 0; i < prod(os); ++i) {
    const Shape idx = unravel(i, os);
    y[size_t(i)] = f(a.v[size_t(bcast_index(idx, as))], b.v[size_t(bcast_index(idx, bs))]);
  }
  return y;
}

// Wraps an integer to the range of dtype dt (two's complement).
double wrap(long double x, DType dt) {
  const auto i = static_cast<int64_t>(static_cast<uint64_t>(static_cast<__int128>(x)));
  switch (dt) {
    case DType::kI32: return int32_t(i);
    case DType::kI8: return int8_t(i);
    case DType::kU8: return uint8_t(i);
    default: return double(i);
  }
}

}  // namespace

// ==== shape rules ============================================================================

TEST(ElementwiseShapes, UnaryKeepsTypeAndChecksDtypes) {
  EXPECT_EQ(infer(OpKind::kGelu, {tt(DType::kF16, {2, 3})})[0], tt(DType::kF16, {2, 3}));
  EXPECT_EQ(infer(OpKind::kRelu, {tt(DType::kI32, {4})})[0], tt(DType::kI32, {4}));
  EXPECT_EQ(infer(OpKind::kNeg, {tt(DType::kI8, {})})[0], tt(DType::kI8, {}));
  EXPECT_EQ(infer(OpKind::kLogicalNot, {tt(DType::kBool, {5})})[0], tt(DType::kBool, {5}));
  expect_error([] { infer(OpKind::kGelu, {tt(DType::kI32, {4})}); }, ErrorCode::kInvalidArgument,
               {"gelu", "floating", "i32[4]"});
  expect_error([] { infer(OpKind::kAbs, {tt(DType::kBool, {4})}); }, ErrorCode::kInvalidArgument,
               {"abs", "floating or integer"});
  expect_error([] { infer(OpKind::kLogicalNot, {tt(DType::kF32, {4})}); }, ErrorCode::kInvalidArgument,
               {"logical_not", "bool"});
  Attrs bad;
  bad.set("approximate", std::string("fast"));
  expect_error([&] { infer(OpKind::kGelu, {tt(DType::kF32, {4})}, bad); }, ErrorCode::kInvalidArgument,
               {"gelu", "approximate", "fast"});
  Attrs wrong_type;
  wrong_type.set("min", std::string("zero"));
  expect_error([&] { infer(OpKind::kClamp, {tt(DType::kF32, {4})}, wrong_type); }, ErrorCode::kInvalidArgument,
               {"clamp", "'min'"});
}

TEST(ElementwiseShapes, BinaryBroadcastsKeepsSymbolsAndChecksDtypes) {
  EXPECT_EQ(infer(OpKind::kAdd, {tt(DType::kF32, {2, 1, 3}), tt(DType::kF32, {4, 1})})[0].shape(), (Shape{2, 4, 3}));
  EXPECT_EQ(infer(OpKind::kMul, {tt(DType::kF32, {}), tt(DType::kF32, {5, 6})})[0].shape(), (Shape{5, 6}));
  EXPECT_EQ(infer(OpKind::kLt, {tt(DType::kI64, {3}), tt(DType::kI64, {3})})[0], tt(DType::kBool, {3}));
  EXPECT_EQ(infer(OpKind::kEq, {tt(DType::kBool, {3}), tt(DType::kBool, {1})})[0], tt(DType::kBool, {3}));
  EXPECT_EQ(infer(OpKind::kDiv, {tt(DType::kI32, {3}), tt(DType::kI32, {3})})[0].dtype, DType::kI32);

  TensorType dyn = tt(DType::kF32, {8, 16});
  dyn.dims[0].symbol = "N";
  dyn.dims[0].min = 1;
  dyn.dims[0].max = 64;
  const TensorType out = infer(OpKind::kAdd, {tt(DType::kF32, {1, 16}), dyn})[0];
  EXPECT_EQ(out.dims[0].symbol, "N");
  EXPECT_EQ(out.dims[0].max, 64);

  expect_error([] { infer(OpKind::kAdd, {tt(DType::kF32, {2, 3}), tt(DType::kF32, {4})}); },
               ErrorCode::kShapeMismatch, {"add", "f32[2,3]", "f32[4]", "broadcast"});
  expect_error([] { infer(OpKind::kSub, {tt(DType::kF32, {3}), tt(DType::kF16, {3})}); },
               ErrorCode::kInvalidArgument, {"sub", "f32[3]", "f16[3]", "dtype"});
  expect_error([] { infer(OpKind::kPow, {tt(DType::kI32, {3}), tt(DType::kI32, {3})}); },
               ErrorCode::kInvalidArgument, {"pow", "floating"});
  expect_error([] { infer(OpKind::kLogicalAnd, {tt(DType::kF32, {3}), tt(DType::kF32, {3})}); },
               ErrorCode::kInvalidArgument, {"logical_and", "bool"});
  expect_error([] { infer(OpKind::kAdd, {tt(DType::kBool, {3}), tt(DType::kBool, {3})}); },
               ErrorCode::kInvalidArgument, {"add", "floating or integer"});
}

TEST(ElementwiseShapes, BroadcastShapesFunction) {
  EXPECT_EQ(broadcast_shapes(OpKind::kAdd, {2, 1, 3}, {4, 1}), (Shape{2, 4, 3}));
  EXPECT_EQ(broadcast_shapes(OpKind::kAdd, {}, {3}), (Shape{3}));
  EXPECT_EQ(broadcast_shapes(OpKind::kAdd, {0, 1}, {1, 5}), (Shape{0, 5}));
  expect_error([] { broadcast_shapes(OpKind::kMaximum, {2, 3}, {3, 3}); }, ErrorCode::kShapeMismatch,
               {"maximum", "[2,3]", "[3,3]"});
}

TEST(ElementwiseShapes, WhereAndCast) {
  EXPECT_EQ(infer(OpKind::kWhere, {tt(DType::kBool, {4, 1}), tt(DType::kF16, {2, 1, 3}), tt(DType::kF16, {})})[0],
            tt(DType::kF16, {2, 4, 3}));
  expect_error([] { infer(OpKind::kWhere, {tt(DType::kF32, {3}), tt(DType::kF32, {3}), tt(DType::kF32, {3})}); },
               ErrorCode::kInvalidArgument, {"where", "cond", "bool"});
  expect_error([] { infer(OpKind::kWhere, {tt(DType::kBool, {3}), tt(DType::kF32, {3}), tt(DType::kI64, {3})}); },
               ErrorCode::kInvalidArgument, {"where", "dtype"});
  expect_error([] { infer(OpKind::kWhere, {tt(DType::kBool, {2}), tt(DType::kF32, {3}), tt(DType::kF32, {3})}); },
               ErrorCode::kShapeMismatch, {"where"});
  Attrs a;
  a.set("dtype", DType::kI8);
  EXPECT_EQ(infer(OpKind::kCast, {tt(DType::kF32, {2})}, a)[0], tt(DType::kI8, {2}));
  expect_error([] { infer(OpKind::kCast, {tt(DType::kF32, {2})}); }, ErrorCode::kInvalidArgument,
               {"cast", "'dtype'"});
}

TEST(ElementwiseShapes, Reductions) {
  Attrs a;
  a.set("axes", Shape{0, 2});
  EXPECT_EQ(infer(OpKind::kReduceSum, {tt(DType::kF32, {2, 3, 4})}, a)[0].shape(), (Shape{3}));
  a.set("keepdim", true);
  EXPECT_EQ(infer(OpKind::kReduceMean, {tt(DType::kF32, {2, 3, 4})}, a)[0].shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(infer(OpKind::kReduceMax, {tt(DType::kF32, {2, 3, 4})})[0].shape(), (Shape{}));  // empty: all
  Attrs am;
  am.set("axis", int64_t{1});
  EXPECT_EQ(infer(OpKind::kArgmax, {tt(DType::kF16, {2, 3, 4})}, am)[0], tt(DType::kI64, {2, 4}));
  EXPECT_EQ(infer(OpKind::kReduceSum, {tt(DType::kI32, {5})})[0], tt(DType::kI32, {}));

  Attrs out_of_range;
  out_of_range.set("axes", Shape{3});
  expect_error([&] { infer(OpKind::kReduceSum, {tt(DType::kF32, {2, 3, 4})}, out_of_range); },
               ErrorCode::kInvalidArgument, {"reduce_sum", "axis 3", "out of range"});
  Attrs twice;
  twice.set("axes", Shape{1, 1});
  expect_error([&] { infer(OpKind::kReduceMin, {tt(DType::kF32, {2, 3})}, twice); }, ErrorCode::kInvalidArgument,
               {"reduce_min", "twice"});
  expect_error([] { infer(OpKind::kReduceMean, {tt(DType::kI64, {3})}); }, ErrorCode::kInvalidArgument,
               {"reduce_mean", "floating"});
  expect_error([] { infer(OpKind::kReduceMax, {tt(DType::kF32, {0, 3})}); }, ErrorCode::kShapeMismatch,
               {"reduce_max", "empty"});
  expect_error([] { infer(OpKind::kArgmax, {tt(DType::kF32, {3})}); }, ErrorCode::kInvalidArgument,
               {"argmax", "'axis'"});
  Attrs corr;
  corr.set("correction", std::string("x"));
  expect_error([&] { infer(OpKind::kReduceVar, {tt(DType::kF32, {3})}, corr); }, ErrorCode::kInvalidArgument,
               {"reduce_var", "'correction'"});
}

TEST(ElementwiseShapes, SoftmaxAndNorms) {
  Attrs ax;
  ax.set("axis", int64_t{1});
  EXPECT_EQ(infer(OpKind::kSoftmax, {tt(DType::kF32, {2, 3})}, ax)[0], tt(DType::kF32, {2, 3}));
  ax.set("axis", int64_t{2});
  expect_error([&] { infer(OpKind::kLogSoftmax, {tt(DType::kF32, {2, 3})}, ax); }, ErrorCode::kInvalidArgument,
               {"log_softmax", "axis 2"});
  ax.set("axis", int64_t{0});
  expect_error([&] { infer(OpKind::kSoftmax, {tt(DType::kI32, {2, 3})}, ax); }, ErrorCode::kInvalidArgument,
               {"softmax", "floating"});

  const TensorType x = tt(DType::kF16, {2, 6, 5, 5});
  EXPECT_EQ(infer(OpKind::kBatchNorm, {x, tt(DType::kF32, {6}), tt(DType::kF32, {6})})[0], x);
  expect_error([&] { infer(OpKind::kBatchNorm, {x, tt(DType::kF32, {5}), tt(DType::kF32, {6})}); },
               ErrorCode::kShapeMismatch, {"batch_norm", "mean", "[6]"});
  expect_error([&] { infer(OpKind::kBatchNorm, {x, tt(DType::kF64, {6}), tt(DType::kF32, {6})}); },
               ErrorCode::kInvalidArgument, {"batch_norm", "mean", "f32"});
  expect_error([] { infer(OpKind::kBatchNorm, {tt(DType::kF32, {6}), tt(DType::kF32, {6}), tt(DType::kF32, {6})}); },
               ErrorCode::kShapeMismatch, {"batch_norm", "[N, C"});

  Attrs ln;
  ln.set("normalized_rank", int64_t{2});
  EXPECT_EQ(infer(OpKind::kLayerNorm, {x, tt(DType::kF16, {5, 5}), tt(DType::kF32, {5, 5})}, ln)[0], x);
  expect_error([&] { infer(OpKind::kLayerNorm, {x, tt(DType::kF16, {5})}, ln); }, ErrorCode::kShapeMismatch,
               {"layer_norm", "weight", "[5,5]"});
  ln.set("normalized_rank", int64_t{5});
  expect_error([&] { infer(OpKind::kLayerNorm, {x}, ln); }, ErrorCode::kInvalidArgument,
               {"layer_norm", "normalized_rank 5"});

  Attrs gn;
  gn.set("groups", int64_t{4});
  expect_error([&] { infer(OpKind::kGroupNorm, {x}, gn); }, ErrorCode::kInvalidArgument,
               {"group_norm", "6 channels", "4 groups"});
  gn.set("groups", int64_t{3});
  EXPECT_EQ(infer(OpKind::kGroupNorm, {x, tt(DType::kF16, {6}), tt(DType::kF16, {6})}, gn)[0], x);
  expect_error([&] { infer(OpKind::kGroupNorm, {x, tt(DType::kF16, {3})}, gn); }, ErrorCode::kShapeMismatch,
               {"group_norm", "weight"});
  expect_error([&] { infer(OpKind::kGroupNorm, {tt(DType::kI32, {2, 6})}, gn); }, ErrorCode::kInvalidArgument,
               {"group_norm", "floating"});
}

TEST(ElementwiseShapes, FusedHasNoRuleOfItsOwn) {
  expect_error([] { infer(OpKind::kFusedPointwise, {tt(DType::kF32, {3})}); }, ErrorCode::kInvalidArgument,
               {"fused_pointwise nodes are created by the fusion pass"});
}

// ==== unary ==================================================================================

namespace {

struct UnaryCase {
  OpKind op;
  double lo, hi;  // input range
  std::function<double(double)> ref;
  Attrs attrs = {};
};

double sigmoid_ref(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::vector<UnaryCase> unary_cases() {
  Attrs tanh_gelu, clamp, clamp_lo, leaky;
  tanh_gelu.set("approximate", std::string("tanh"));
  clamp.set("min", -0.5);
  clamp.set("max", 1.25);
  clamp_lo.set("min", 0.25);
  leaky.set("negative_slope", 0.2);
  return {
      {OpKind::kRelu, -4, 4, [](double x) { return x > 0 ? x : 0.0; }},
      {OpKind::kGelu, -5, 5, [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }},
      {OpKind::kGelu, -5, 5,
       [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); },
       tanh_gelu},
      {OpKind::kSilu, -8, 8, [](double x) { return x * sigmoid_ref(x); }},
      {OpKind::kSigmoid, -12, 12, sigmoid_ref},
      {OpKind::kTanh, -6, 6, [](double x) { return std::tanh(x); }},
      {OpKind::kTanh, -0.4, 0.4, [](double x) { return std::tanh(x); }},  // where exp(2x) - 1 would cancel
      {OpKind::kExp, -20, 20, [](double x) { return std::exp(x); }},
      {OpKind::kLog, 0.05, 50, [](double x) { return std::log(x); }},
      {OpKind::kSqrt, 0, 9, [](double x) { return std::sqrt(x); }},
      {OpKind::kRsqrt, 0.05, 9, [](double x) { return 1 / std::sqrt(x); }},
      {OpKind::kNeg, -4, 4, [](double x) { return -x; }},
      {OpKind::kAbs, -4, 4, [](double x) { return std::fabs(x); }},
      {OpKind::kErf, -3, 3, [](double x) { return std::erf(x); }},
      {OpKind::kHardswish, -5, 5, [](double x) { return x * std::min(std::max(x + 3, 0.0), 6.0) / 6; }},
      {OpKind::kHardsigmoid, -5, 5, [](double x) { return std::min(std::max(x + 3, 0.0), 6.0) / 6; }},
      {OpKind::kReciprocal, 0.25, 4, [](double x) { return 1 / x; }},
      {OpKind::kSin, -6, 6, [](double x) { return std::sin(x); }},
      {OpKind::kCos, -6, 6, [](double x) { return std::cos(x); }},
      {OpKind::kClamp, -2, 2, [](double x) { return std::min(std::max(x, -0.5), 1.25); }, clamp},
      {OpKind::kClamp, -2, 2, [](double x) { return std::max(x, 0.25); }, clamp_lo},
      {OpKind::kLeakyRelu, -3, 3, [](double x) { return x < 0 ? 0.2 * x : x; }, leaky},
  };
}

}  // namespace

TEST(ElementwiseKernels, UnaryFloatOpsMatchReference) {
  const std::vector<Shape> shapes = {{}, {7}, {3, 5, 17}, {70001}};
  uint32_t seed = 1;
  for (const UnaryCase& c : unary_cases()) {
    for (DType dt : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
      for (const Shape& s : shapes) {
        if (dt != DType::kF32 && prod(s) > 1000) continue;
        Tensor x = rand_t(dt, s, seed++, c.lo, c.hi);
        // Functions with steep slopes amplify an input's rounding; compare at the rounded input.
        std::vector<double> want;
        for (double v : x.v) want.push_back(round_to(c.ref(v), dt));
        Result r = run_op(c.op, {x}, c.attrs);
        EXPECT_EQ(r.type, x.type);
        const bool exp32 = dt == DType::kF32 && c.op == OpKind::kExp;  // relative accuracy everywhere
        expect_close(r.v, want, exp32 ? 4e-6 : rtol_for(dt), exp32 ? 0 : atol_for(dt),
                     std::string(op_name(c.op)) + " " + dtype_name(dt) + " " + x.type.to_string());
      }
    }
  }
}

TEST(ElementwiseKernels, UnarySpecialValues) {
  auto one = [](OpKind op, double v, Attrs a = {}) { return run_op(op, {from_values(DType::kF32, {1}, {v})}, a).v[0]; };
  EXPECT_EQ(one(OpKind::kExp, 100), kInf);
  EXPECT_EQ(one(OpKind::kExp, -200), 0.0);
  EXPECT_NEAR(one(OpKind::kExp, -100), std::exp(-100.0), 1.5e-45);  // subnormal: within one step
  EXPECT_NEAR(one(OpKind::kExp, 88.5) / std::exp(88.5), 1.0, 1e-6);
  EXPECT_EQ(one(OpKind::kSigmoid, -200), 0.0);
  EXPECT_EQ(one(OpKind::kSigmoid, 200), 1.0);
  EXPECT_EQ(one(OpKind::kTanh, 50), 1.0);
  EXPECT_EQ(one(OpKind::kTanh, -50), -1.0);
  EXPECT_NEAR(one(OpKind::kTanh, 1e-6) / 1e-6, 1.0, 1e-6);
  EXPECT_EQ(one(OpKind::kSilu, -200), 0.0);
  EXPECT_EQ(one(OpKind::kSilu, 200), 200.0);
  EXPECT_TRUE(std::isnan(one(OpKind::kExp, kNaN)));
  EXPECT_TRUE(std::isnan(one(OpKind::kTanh, kNaN)));
  EXPECT_TRUE(std::isnan(one(OpKind::kRelu, kNaN)));
  EXPECT_TRUE(std::isnan(one(OpKind::kSqrt, -1)));
  Attrs clamp;
  clamp.set("min", 0.0);
  clamp.set("max", 1.0);
  EXPECT_TRUE(std::isnan(one(OpKind::kClamp, kNaN, clamp)));
  Attrs inverted;  // min > max: PyTorch returns max
  inverted.set("min", 2.0);
  inverted.set("max", 1.0);
  EXPECT_EQ(one(OpKind::kClamp, 0.0, inverted), 1.0);
  EXPECT_EQ(one(OpKind::kClamp, 5.0, inverted), 1.0);
}

TEST(ElementwiseKernels, UnaryIntegerOpsAreExactAndWrap) {
  Attrs clamp;
  clamp.set("min", -2.5);  // integers inside [-2.5, 3.7]: -2..3
  clamp.set("max", 3.7);
  for (DType dt : {DType::kI64, DType::kI32, DType::kI8, DType::kU8}) {
    const double lo = dt == DType::kU8 ? 0 : dt == DType::kI8 ? -128 : -1000, hi = dt == DType::kU8 ? 256 : dt == DType::kI8 ? 128 : 1000;
    Tensor x = rand_t(dt, {5, 13}, 7, lo, hi);
    x.v[0] = lo;  // the most negative value: neg and abs wrap for i8
    for (OpKind op : {OpKind::kRelu, OpKind::kNeg, OpKind::kAbs, OpKind::kClamp}) {
      std::vector<double> want;
      for (double v : x.v) {
        switch (op) {
          case OpKind::kRelu: want.push_back(v > 0 ? v : 0); break;
          case OpKind::kNeg: want.push_back(wrap(-(long double)v, dt)); break;
          case OpKind::kAbs: want.push_back(wrap(std::fabs(v), dt)); break;
          default: want.push_back(std::min(std::max(v, -2.0), 3.0)); break;
        }
      }
      Result r = run_op(op, {x}, op == OpKind::kClamp ? clamp : Attrs{});
      EXPECT_EQ(r.v, want) << op_name(op) << " " << dtype_name(dt);
    }
  }
  // i64 beyond 2^53: no detour through floating point.
  Graph g;
  const ValueId x = g.add_input("x", tt(DType::kI64, {2}));
  const ValueId y = g.add_node1(OpKind::kNeg, {x});
  auto k = get_backend(Device{}).make_kernel(*g.nodes().back(), g, {});
  int64_t in[2] = {(int64_t(1) << 62) + 1, std::numeric_limits<int64_t>::min()};
  auto out = run_kernel(*k, {in}, {g.type(y)});
  int64_t got[2];
  std::memcpy(got, out[0].data(), 16);
  EXPECT_EQ(got[0], -((int64_t(1) << 62) + 1));
  EXPECT_EQ(got[1], std::numeric_limits<int64_t>::min());
}

TEST(ElementwiseKernels, LogicalNot) {
  Tensor x = rand_t(DType::kBool, {3, 7}, 3);
  Result r = run_op(OpKind::kLogicalNot, {x});
  for (size_t i = 0; i < x.v.size(); ++i) EXPECT_EQ(r.v[i], x.v[i] ? 0.0 : 1.0);
}

// ==== binary =================================================================================

namespace {

const std::vector<std::pair<Shape, Shape>>& binary_shapes() {
  static const std::vector<std::pair<Shape, Shape>> s = {
      {{3, 5, 7}, {3, 5, 7}},  // same shape
      {{2, 1, 3}, {4, 1}},     // both broadcast
      {{}, {5, 6}},            // 0-d scalar
      {{5, 6}, {}},
      {{8, 16}, {16}},         // bias add
      {{8, 16}, {8, 1}},       // column broadcast
      {{1}, {1}},
      {{37}, {37}},            // odd size
      {{2, 3, 1, 5}, {3, 4, 1}},
      {{300, 301}, {301}},     // large: split over threads
      {{1, 90001}, {90001}},
  };
  return s;
}

double ref_arith(OpKind op, double a, double b) {
  switch (op) {
    case OpKind::kAdd: return a + b;
    case OpKind::kSub: return a - b;
    case OpKind::kMul: return a * b;
    case OpKind::kDiv: return a / b;
    case OpKind::kPow: return std::pow(a, b);
    case OpKind::kMaximum: return std::max(a, b);
    case OpKind::kMinimum: return std::min(a, b);
    case OpKind::kEq: return a == b;
    case OpKind::kNe: return a != b;
    case OpKind::kLt: return a < b;
    case OpKind::kLe: return a <= b;
    case OpKind::kGt: return a > b;
    case OpKind::kGe: return a >= b;
    case OpKind::kLogicalAnd: return a != 0 && b != 0;
    case OpKind::kLogicalOr: return a != 0 || b != 0;
    default: ADD_FAILURE() << "no reference for " << op_name(op); return 0;
  }
}

// Values with ties so that comparisons see equal elements: multiples of 0.5 in [-2, 2].
Tensor coarse(DType dt, const Shape& s, uint32_t seed) {
  Tensor t = rand_t(dt, s, seed, -4.0, 5.0);
  for (double& v : t.v) v = std::floor(v) / 2;
  return t;
}

}  // namespace

TEST(ElementwiseKernels, BinaryFloatArithmeticMatchesReference) {
  uint32_t seed = 100;
  for (OpKind op : {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kDiv, OpKind::kPow, OpKind::kMaximum,
                    OpKind::kMinimum}) {
    for (DType dt : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
      for (const auto& [as, bs] : binary_shapes()) {
        if (dt != DType::kF32 && prod(bcast_shape(as, bs)) > 5000) continue;
        Tensor a = op == OpKind::kPow ? rand_t(dt, as, seed++, 0.1, 3) : rand_t(dt, as, seed++, -2, 2);
        Tensor b = rand_t(dt, bs, seed++, op == OpKind::kDiv ? 0.5 : -2, 2);
        Result r = run_op(op, {a, b});
        ASSERT_EQ(r.type.shape(), bcast_shape(as, bs));
        std::vector<double> want = ref_binary(a, b, [&](double x, double y) { return round_to(ref_arith(op, x, y), dt); });
        expect_close(r.v, want, rtol_for(dt), atol_for(dt),
                     std::string(op_name(op)) + " " + a.type.to_string() + " " + b.type.to_string());
      }
    }
  }
}

TEST(ElementwiseKernels, PowWithConstantExponents) {
  for (double e : {2.0, 0.5, 1.0, 3.0, -1.5}) {
    Tensor a = rand_t(DType::kF32, {4, 33}, 9, 0.0, 3.0);
    a.v[0] = 0.0;
    Tensor b = from_values(DType::kF32, {}, {e});
    b.constant = true;
    Result r = run_op(OpKind::kPow, {a, b});
    expect_close(r.v, ref_binary(a, b, [](double x, double y) { return std::pow(x, y); }), 1e-6, 0,
                 "pow exponent " + std::to_string(e));
  }
  Tensor edge = from_values(DType::kF32, {3}, {-0.0, -kInf, -4.0});
  Tensor half = from_values(DType::kF32, {}, {0.5});
  Result r = run_op(OpKind::kPow, {edge, half});
  EXPECT_EQ(r.v[0], 0.0);
  EXPECT_FALSE(std::signbit(r.v[0]));  // pow(-0, 0.5) = +0, unlike sqrt
  EXPECT_EQ(r.v[1], kInf);             // pow(-inf, 0.5) = inf
  EXPECT_TRUE(std::isnan(r.v[2]));
}

TEST(ElementwiseKernels, ComparisonsAndLogicalOps) {
  uint32_t seed = 200;
  for (OpKind op : {OpKind::kEq, OpKind::kNe, OpKind::kLt, OpKind::kLe, OpKind::kGt, OpKind::kGe}) {
    for (DType dt : {DType::kF32, DType::kF16, DType::kF64, DType::kI64, DType::kI8, DType::kU8, DType::kBool}) {
      for (const auto& [as, bs] : binary_shapes()) {
        if (prod(bcast_shape(as, bs)) > 5000 && dt != DType::kF32) continue;
        Tensor a = coarse(dt, as, seed++), b = coarse(dt, bs, seed++);
        if (is_integral(dt) || dt == DType::kBool) {
          a = rand_t(dt, as, seed++, dt == DType::kU8 ? 0 : -3, 3);
          b = rand_t(dt, bs, seed++, dt == DType::kU8 ? 0 : -3, 3);
        }
        Result r = run_op(op, {a, b});
        EXPECT_EQ(r.type.dtype, DType::kBool);
        EXPECT_EQ(r.v, ref_binary(a, b, [&](double x, double y) { return ref_arith(op, x, y); }))
            << op_name(op) << " " << a.type.to_string() << " " << b.type.to_string();
      }
    }
  }
  for (OpKind op : {OpKind::kLogicalAnd, OpKind::kLogicalOr}) {
    Tensor a = rand_t(DType::kBool, {2, 1, 3}, seed++), b = rand_t(DType::kBool, {4, 1}, seed++);
    EXPECT_EQ(run_op(op, {a, b}).v, ref_binary(a, b, [&](double x, double y) { return ref_arith(op, x, y); }));
  }
  // NaN compares unequal to everything, itself included.
  Tensor n = from_values(DType::kF32, {2}, {kNaN, 1.0});
  EXPECT_EQ(run_op(OpKind::kEq, {n, n}).v, (std::vector<double>{0, 1}));
  EXPECT_EQ(run_op(OpKind::kNe, {n, n}).v, (std::vector<double>{1, 0}));
}

TEST(ElementwiseKernels, BinaryIntegerOpsAreExactAndWrap) {
  uint32_t seed = 300;
  for (DType dt : {DType::kI64, DType::kI32, DType::kI8, DType::kU8}) {
    const double lo = dt == DType::kU8 ? 0 : dt == DType::kI8 ? -128 : -100000;
    const double hi = dt == DType::kU8 ? 256 : dt == DType::kI8 ? 128 : 100000;
    for (OpKind op : {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kDiv, OpKind::kMaximum, OpKind::kMinimum}) {
      for (const auto& [as, bs] : binary_shapes()) {
        if (prod(bcast_shape(as, bs)) > 5000) continue;
        Tensor a = rand_t(dt, as, seed++, lo, hi), b = rand_t(dt, bs, seed++, lo, hi);
        if (!b.v.empty()) b.v[0] = 0;  // integer division by zero gives 0
        Result r = run_op(op, {a, b});
        auto f = [&](double x, double y) -> double {
          const long double X = x, Y = y;
          switch (op) {
            case OpKind::kAdd: return wrap(X + Y, dt);
            case OpKind::kSub: return wrap(X - Y, dt);
            case OpKind::kMul: return wrap(X * Y, dt);
            case OpKind::kDiv: return y == 0 ? 0.0 : wrap(std::trunc(X / Y), dt);
            case OpKind::kMaximum: return std::max(x, y);
            default: return std::min(x, y);
          }
        };
        EXPECT_EQ(r.v, ref_binary(a, b, f)) << op_name(op) << " " << a.type.to_string() << " " << b.type.to_string();
      }
    }
  }
  // i64 beyond 2^53 and the i64 corner cases, with no detour through floating point.
  Graph g;
  const ValueId a = g.add_input("a", tt(DType::kI64, {4})), b = g.add_input("b", tt(DType::kI64, {4}));
  const int64_t big = (int64_t(1) << 62) + 3, kMin = std::numeric_limits<int64_t>::min();
  const int64_t av[4] = {big, big, kMin, -7}, bv[4] = {1, 3, -1, 2};
  auto check = [&](OpKind op, std::vector<int64_t> want) {
    Graph gg = g;
    const ValueId y = gg.add_node1(op, {a, b});
    auto k = get_backend(Device{}).make_kernel(*gg.nodes().back(), gg, {});
    auto out = run_kernel(*k, {av, bv}, {gg.type(y)});
    std::vector<int64_t> got(4);
    std::memcpy(got.data(), out[0].data(), 32);
    EXPECT_EQ(got, want) << op_name(op);
  };
  check(OpKind::kAdd, {big + 1, big + 3, std::numeric_limits<int64_t>::max(), -5});  // kMin + -1 wraps
  check(OpKind::kDiv, {big, big / 3, kMin, -3});  // truncation toward zero; kMin / -1 wraps
  check(OpKind::kMaximum, {big, big, -1, 2});
  check(OpKind::kSub, {big - 1, big - 3, kMin + 1, -9});
}

// ==== where and cast =========================================================================

TEST(ElementwiseKernels, WhereBroadcastsEveryDtype) {
  uint32_t seed = 400;
  const std::vector<std::array<Shape, 3>> shapes = {
      {Shape{3, 5}, Shape{3, 5}, Shape{3, 5}},
      {Shape{4, 1}, Shape{2, 1, 3}, Shape{}},
      {Shape{}, Shape{6}, Shape{6}},
      {Shape{2, 50000}, Shape{50000}, Shape{2, 1}},
  };
  for (DType dt : {DType::kF32, DType::kF16, DType::kF64, DType::kI64, DType::kI32, DType::kI8, DType::kBool}) {
    for (const auto& s : shapes) {
      Tensor c = rand_t(DType::kBool, s[0], seed++);
      Tensor a = rand_t(dt, s[1], seed++, -50, 50), b = rand_t(dt, s[2], seed++, -50, 50);
      Result r = run_op(OpKind::kWhere, {c, a, b});
      const Shape os = bcast_shape(bcast_shape(s[0], s[1]), s[2]);
      ASSERT_EQ(r.type.shape(), os);
      std::vector<double> want(size_t(prod(os)));
      for (int64_t i = 0; i < prod(os); ++i) {
        const Shape idx = unravel(i, os);
        want[size_t(i)] = c.v[size_t(bcast_index(idx, s[0]))] ? a.v[size_t(bcast_index(idx, s[1]))]
                                                               : b.v[size_t(bcast_index(idx, s[2]))];
      }
      EXPECT_EQ(r.v, want) << dtype_name(dt) << " " << r.type.to_string();
    }
  }
}

namespace {

double ref_cast(double v, DType from, DType to) {
  if (is_floating(to)) return round_to(v, to);
  if (to == DType::kBool) return v != 0;
  int64_t i;
  if (!is_floating(from)) i = int64_t(v);
  else if (std::isnan(v)) i = 0;
  else if (v >= 9.2233720368547758e18) i = std::numeric_limits<int64_t>::max();
  else if (v <= -9.2233720368547758e18) i = std::numeric_limits<int64_t>::min();
  else i = int64_t(std::trunc(v));
  return wrap((long double)i, to);
}

Tensor cast_input(DType dt, const Shape& s, uint32_t seed) {
  switch (dt) {
    case DType::kI64: return rand_t(dt, s, seed, -1e15, 1e15);
    case DType::kI32: return rand_t(dt, s, seed, -2147483648.0, 2147483648.0);
    case DType::kI8: return rand_t(dt, s, seed, -128, 128);
    case DType::kU8: return rand_t(dt, s, seed, 0, 256);
    case DType::kBool: return rand_t(dt, s, seed);
    default: {
      Tensor t = rand_t(dt, s, seed, -300, 300);
      const double special[] = {kNaN, kInf, -kInf, 1e20, -0.7, 0.0, 255.9, -128.5, 70000.25};
      for (size_t i = 0; i < std::size(special) && i < t.v.size(); ++i) t.v[i] = round_to(special[i], dt);
      return t;
    }
  }
}

}  // namespace

TEST(ElementwiseKernels, CastEveryDtypeToEveryDtype) {
  uint32_t seed = 500;
  for (int f = 0; f < kNumDTypes; ++f) {
    for (int t = 0; t < kNumDTypes; ++t) {
      const DType from = DType(f), to = DType(t);
      for (const Shape& s : {Shape{3, 41}, Shape{}}) {
        Tensor x = cast_input(from, s, seed++);
        Attrs a;
        a.set("dtype", to);
        Result r = run_op(OpKind::kCast, {x}, a);
        EXPECT_EQ(r.type, tt(to, s));
        std::vector<double> want;
        for (double v : x.v) want.push_back(ref_cast(v, from, to));
        ASSERT_EQ(r.v.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          const bool ok = r.v[i] == want[i] || (std::isnan(r.v[i]) && std::isnan(want[i]));
          EXPECT_TRUE(ok) << dtype_name(from) << " " << x.v[i] << " -> " << dtype_name(to) << ": got " << r.v[i]
                          << ", want " << want[i];
        }
      }
    }
  }
  // A large tensor splits over threads.
  Tensor big = cast_input(DType::kF32, {200001}, 7);
  Attrs a;
  a.set("dtype", DType::kF16);
  Result r = run_op(OpKind::kCast, {big}, a);
  for (size_t i = 9; i < big.v.size(); i += 997) EXPECT_EQ(r.v[i], round_to(big.v[i], DType::kF16));  // past NaNs
}

// ==== reductions =============================================================================

namespace {

// Reference reduction: groups the elements of x by their output index.
std::vector<double> ref_reduce(OpKind op, const Tensor& x, const std::vector<int64_t>& axes, double correction = 1) {
  const Shape s = x.type.shape();
  std::vector<char> red(s.size(), axes.empty() ? 1 : 0);
  for (int64_t a : axes) red[size_t(a)] = 1;
  Shape os;
  for (size_t d = 0; d < s.size(); ++d)
    if (!red[d]) os.push_back(s[d]);
  std::vector<std::vector<double>> groups(size_t(prod(os)));
  for (int64_t i = 0; i < prod(s); ++i) {
    const Shape idx = unravel(i, s);
    int64_t o = 0;
    for (size_t d = 0; d < s.size(); ++d)
      if (!red[d]) o = o * s[d] + idx[d];
    groups[size_t(o)].push_back(x.v[size_t(i)]);
  }
  std::vector<double> y;
  for (const auto& g : groups) {
    double sum = 0, mx = -kInf, mn = kInf;
    for (double v : g) sum += v, mx = std::max(mx, v), mn = std::min(mn, v);
    const double mean = sum / double(g.size());
    double sq = 0;
    for (double v : g) sq += (v - mean) * (v - mean);
    switch (op) {
      case OpKind::kReduceSum: y.push_back(sum); break;
      case OpKind::kReduceMean: y.push_back(mean); break;
      case OpKind::kReduceMax: y.push_back(mx); break;
      case OpKind::kReduceMin: y.push_back(mn); break;
      case OpKind::kReduceVar: y.push_back(sq / (double(g.size()) - correction)); break;
      default: ADD_FAILURE();
    }
  }
  return y;
}

Attrs reduce_attrs(const std::vector<int64_t>& axes, bool keepdim) {
  Attrs a;
  a.set("axes", axes);
  a.set("keepdim", keepdim);
  return a;
}

}  // namespace

TEST(ElementwiseKernels, ReductionsOverEveryAxisSet) {
  const std::vector<std::pair<Shape, std::vector<Shape>>> cases = {
      {{3, 4, 5}, {{}, {0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1}, {0, 1, 2}}},
      {{2, 3, 4, 5}, {{1, 3}, {0, 2}, {3}, {0, 1, 3}}},
      {{2, 1, 7}, {{1}, {0, 1}}},  // a reduced extent-1 dim
      {{}, {{}}},
      {{64, 1000}, {{1}, {0}}},     // large: rows and columns split over threads
      {{100003}, {{0}}},
  };
  uint32_t seed = 600;
  for (OpKind op : {OpKind::kReduceSum, OpKind::kReduceMean, OpKind::kReduceMax, OpKind::kReduceMin,
                    OpKind::kReduceVar}) {
    for (DType dt : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
      for (const auto& [shape, axes_list] : cases) {
        if (dt != DType::kF32 && prod(shape) > 5000) continue;
        for (const Shape& axes : axes_list) {
          for (bool keepdim : {false, true}) {
            Tensor x = rand_t(dt, shape, seed++, -2, 3);
            Result r = run_op(op, {x}, reduce_attrs(axes, keepdim));
            Shape os;
            for (size_t d = 0; d < shape.size(); ++d) {
              const bool red = axes.empty() || std::find(axes.begin(), axes.end(), int64_t(d)) != axes.end();
              if (!red) os.push_back(shape[d]);
              else if (keepdim) os.push_back(1);
            }
            EXPECT_EQ(r.type, tt(dt, os));
            std::vector<double> want = ref_reduce(op, x, axes);
            for (double& w : want) w = round_to(w, dt);
            const double atol = op == OpKind::kReduceSum ? atol_for(dt) * 10 : atol_for(dt);
            expect_close(r.v, want, rtol_for(dt), atol,
                         std::string(op_name(op)) + " " + x.type.to_string() + " axes " + std::to_string(axes.size()));
          }
        }
      }
    }
  }
}

TEST(ElementwiseKernels, ReduceVarCorrectionAndEmptyReductions) {
  Tensor x = rand_t(DType::kF32, {4, 9}, 11);
  for (double c : {0.0, 1.0, 2.0}) {
    Attrs a = reduce_attrs({1}, false);
    a.set("correction", c);
    expect_close(run_op(OpKind::kReduceVar, {x}, a).v, ref_reduce(OpKind::kReduceVar, x, {1}, c), 1e-5, 1e-7,
                 "correction " + std::to_string(c));
  }
  Tensor empty = rand_t(DType::kF32, {0, 3}, 1);
  Result s = run_op(OpKind::kReduceSum, {empty}, reduce_attrs({0}, false));
  EXPECT_EQ(s.v, (std::vector<double>{0, 0, 0}));
  Result m = run_op(OpKind::kReduceMean, {empty}, reduce_attrs({0}, false));
  for (double v : m.v) EXPECT_TRUE(std::isnan(v));
  Result none_left = run_op(OpKind::kReduceSum, {empty}, reduce_attrs({1}, false));
  EXPECT_EQ(none_left.type.shape(), (Shape{0}));
}

TEST(ElementwiseKernels, ReduceMaxPropagatesNaN) {
  Tensor x = from_values(DType::kF32, {2, 3}, {1, kNaN, 3, 4, 5, 6});
  Result r = run_op(OpKind::kReduceMax, {x}, reduce_attrs({1}, false));
  EXPECT_TRUE(std::isnan(r.v[0]));
  EXPECT_EQ(r.v[1], 6);
  Result c = run_op(OpKind::kReduceMin, {x}, reduce_attrs({0}, false));
  EXPECT_EQ(c.v[0], 1);
  EXPECT_TRUE(std::isnan(c.v[1]));
}

TEST(ElementwiseKernels, IntegerReductionsAreExact) {
  uint32_t seed = 700;
  for (DType dt : {DType::kI64, DType::kI32, DType::kI8, DType::kU8}) {
    const double lo = dt == DType::kU8 ? 0 : -100, hi = 100;
    Tensor x = rand_t(dt, {6, 7, 5}, seed++, lo, hi);
    for (const Shape& axes : {Shape{}, Shape{1}, Shape{0, 2}}) {
      for (OpKind op : {OpKind::kReduceSum, OpKind::kReduceMax, OpKind::kReduceMin}) {
        std::vector<double> want = ref_reduce(op, x, axes);
        for (double& w : want) w = wrap((long double)w, dt);  // i8 / u8 sums wrap
        EXPECT_EQ(run_op(op, {x}, reduce_attrs(axes, false)).v, want) << op_name(op) << " " << dtype_name(dt);
      }
    }
  }
  // An i64 sum beyond 2^53 stays exact.
  Graph g;
  const ValueId x = g.add_input("x", tt(DType::kI64, {3}));
  const ValueId y = g.add_node1(OpKind::kReduceSum, {x}, reduce_attrs({}, false));
  auto k = get_backend(Device{}).make_kernel(*g.nodes().back(), g, {});
  const int64_t in[3] = {(int64_t(1) << 60) + 1, (int64_t(1) << 60) + 2, -3};
  auto out = run_kernel(*k, {in}, {g.type(y)});
  int64_t got;
  std::memcpy(&got, out[0].data(), 8);
  EXPECT_EQ(got, (int64_t(1) << 61));
  // max / min over bool are any / all.
  Tensor b = from_values(DType::kBool, {2, 3}, {0, 1, 0, 0, 0, 0});
  EXPECT_EQ(run_op(OpKind::kReduceMax, {b}, reduce_attrs({1}, false)).v, (std::vector<double>{1, 0}));
  EXPECT_EQ(run_op(OpKind::kReduceMin, {b}, reduce_attrs({0}, false)).v, (std::vector<double>{0, 0, 0}));
}

TEST(ElementwiseKernels, ArgmaxTakesTheFirstMaximum) {
  uint32_t seed = 800;
  const Shape s{3, 4, 300};
  for (DType dt : {DType::kF32, DType::kF16, DType::kI64, DType::kI8}) {
    Tensor x = rand_t(dt, s, seed++, -3, 3);
    if (is_floating(dt))
      for (double& v : x.v) v = std::round(v);  // many ties
    for (int64_t axis = 0; axis < 3; ++axis) {
      for (bool keepdim : {false, true}) {
        Attrs a;
        a.set("axis", axis);
        a.set("keepdim", keepdim);
        Result r = run_op(OpKind::kArgmax, {x}, a);
        EXPECT_EQ(r.type.dtype, DType::kI64);
        Shape os = s;
        os[size_t(axis)] = 1;
        if (!keepdim) os.erase(os.begin() + axis);
        EXPECT_EQ(r.type.shape(), os);
        std::vector<double> want;
        for (int64_t o = 0; o < prod(s) / s[size_t(axis)]; ++o) {
          Shape idx = unravel(o, [&] {
            Shape k = s;
            k[size_t(axis)] = 1;
            return k;
          }());
          int64_t best = 0;
          double bv = -kInf;
          for (int64_t r2 = 0; r2 < s[size_t(axis)]; ++r2) {
            idx[size_t(axis)] = r2;
            int64_t lin = 0;
            for (size_t d = 0; d < s.size(); ++d) lin = lin * s[d] + idx[d];
            if (x.v[size_t(lin)] > bv) bv = x.v[size_t(lin)], best = r2;
          }
          want.push_back(double(best));
        }
        EXPECT_EQ(r.v, want) << dtype_name(dt) << " axis " << axis;
      }
    }
  }
}

// ==== softmax ================================================================================

namespace {

std::vector<double> ref_softmax(const Tensor& x, int64_t axis, bool log) {
  const Shape s = x.type.shape();
  int64_t outer = 1, inner = 1;
  const int64_t R = s[size_t(axis)];
  for (int64_t d = 0; d < axis; ++d) outer *= s[size_t(d)];
  for (size_t d = size_t(axis) + 1; d < s.size(); ++d) inner *= s[d];
  std::vector<double> y(x.v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      auto at = [&](int64_t r) { return size_t((o * R + r) * inner + j); };
      double m = -kInf, sum = 0;
      for (int64_t r = 0; r < R; ++r) m = std::max(m, x.v[at(r)]);
      for (int64_t r = 0; r < R; ++r) sum += std::exp(x.v[at(r)] - m);
      for (int64_t r = 0; r < R; ++r)
        y[at(r)] = log ? x.v[at(r)] - m - std::log(sum) : std::exp(x.v[at(r)] - m) / sum;
    }
  return y;
}

}  // namespace

TEST(ElementwiseKernels, SoftmaxOverAnyAxisIsStable) {
  uint32_t seed = 900;
  const std::vector<Shape> shapes = {{3, 4, 5}, {2, 1000}, {7}, {64, 3, 129}, {4, 300, 2}};
  for (OpKind op : {OpKind::kSoftmax, OpKind::kLogSoftmax}) {
    for (DType dt : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
      for (const Shape& s : shapes) {
        for (int64_t axis = 0; axis < int64_t(s.size()); ++axis) {
          Tensor x = rand_t(dt, s, seed++, -6, 6);
          if (dt == DType::kF32 || dt == DType::kF64)
            for (double& v : x.v) v = round_to(v + 1000, dt);  // exp(x) alone would overflow
          Attrs a;
          a.set("axis", axis);
          Result r = run_op(op, {x}, a);
          std::vector<double> want = ref_softmax(x, axis, op == OpKind::kLogSoftmax);
          for (double& w : want) w = round_to(w, dt);
          const double rtol = dt == DType::kF32 ? 2e-5 : rtol_for(dt);
          expect_close(r.v, want, rtol, atol_for(dt), std::string(op_name(op)) + " " + x.type.to_string() + " axis " +
                                                  std::to_string(axis));
        }
      }
    }
  }
}

TEST(ElementwiseKernels, SoftmaxMaskedEntriesAndNaN) {
  Tensor x = from_values(DType::kF32, {2, 4}, {0.5, -kInf, 1.5, -kInf, 1, 2, kNaN, 3});
  Attrs a;
  a.set("axis", int64_t{1});
  Result r = run_op(OpKind::kSoftmax, {x}, a);
  const double e = std::exp(1.0);
  EXPECT_NEAR(r.v[0], 1 / (1 + e), 1e-6);
  EXPECT_EQ(r.v[1], 0.0);
  EXPECT_NEAR(r.v[2], e / (1 + e), 1e-6);
  EXPECT_EQ(r.v[3], 0.0);
  for (int i = 4; i < 8; ++i) EXPECT_TRUE(std::isnan(r.v[size_t(i)]));  // NaN spreads over its row
}

// ==== normalizations =========================================================================

TEST(ElementwiseKernels, LayerNorm) {
  uint32_t seed = 1000;
  for (DType dt : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16}) {
    for (auto [shape, k] : std::vector<std::pair<Shape, int64_t>>{{{4, 7, 33}, 1}, {{4, 7, 33}, 2}, {{5}, 1},
                                                                   {{3, 2, 4, 6}, 3}, {{300, 768}, 1}}) {
      if (dt != DType::kF32 && prod(shape) > 5000) continue;
      const Shape ns(shape.end() - k, shape.end());
      for (int affine = 0; affine < 3; ++affine) {
        Tensor x = rand_t(dt, shape, seed++, -3, 5);
        const DType pdt = affine == 2 ? DType::kF32 : dt;  // f32 parameters with a 16-bit x
        Tensor w = affine ? rand_t(pdt, ns, seed++, 0.5, 1.5) : none();
        Tensor b = affine ? rand_t(pdt, ns, seed++, -1, 1) : none();
        if (affine == 2) w.constant = true;
        Attrs a;
        a.set("normalized_rank", k);
        a.set("eps", 1e-5);
        Result r = run_op(OpKind::kLayerNorm, {x, w, b}, a);
        const int64_t D = prod(ns);
        std::vector<double> want(x.v.size());
        for (int64_t row = 0; row < prod(shape) / D; ++row) {
          double mean = 0, var = 0;
          for (int64_t i = 0; i < D; ++i) mean += x.v[size_t(row * D + i)];
          mean /= double(D);
          for (int64_t i = 0; i < D; ++i) var += std::pow(x.v[size_t(row * D + i)] - mean, 2);
          var /= double(D);
          for (int64_t i = 0; i < D; ++i) {
            double v = (x.v[size_t(row * D + i)] - mean) / std::sqrt(var + 1e-5);
            if (affine) v = v * w.v[size_t(i)] + b.v[size_t(i)];
            want[size_t(row * D + i)] = round_to(v, dt);
          }
        }
        expect_close(r.v, want, rtol_for(dt) * 2, atol_for(dt) * 4, "layer_norm " + x.type.to_string());
      }
    }
  }
}

TEST(ElementwiseKernels, BatchNormInference) {
  uint32_t seed = 1100;
  for (DType dt : {DType::kF32, DType::kF64, DType::kF16}) {
    for (const Shape& shape : {Shape{2, 5, 3, 7}, Shape{4, 6}, Shape{1, 3, 11}, Shape{8, 64, 28, 28}}) {
      if (dt != DType::kF32 && prod(shape) > 5000) continue;
      const int64_t C = shape[1];
      for (bool affine : {false, true}) {
        Tensor x = rand_t(dt, shape, seed++, -2, 2);
        Tensor mean = rand_t(DType::kF32, {C}, seed++, -1, 1), var = rand_t(DType::kF32, {C}, seed++, 0.2, 2);
        mean.constant = var.constant = true;
        Tensor w = affine ? rand_t(dt, {C}, seed++, 0.5, 1.5) : none();
        Tensor b = affine ? rand_t(dt, {C}, seed++, -1, 1) : none();
        Attrs a;
        a.set("eps", 1e-3);
        Result r = run_op(OpKind::kBatchNorm, {x, mean, var, w, b}, a);
        const int64_t S = prod(shape) / (shape[0] * C);
        std::vector<double> want(x.v.size());
        for (size_t i = 0; i < x.v.size(); ++i) {
          const size_t c = size_t((int64_t(i) / S) % C);
          double v = (x.v[i] - mean.v[c]) / std::sqrt(var.v[c] + 1e-3);
          if (affine) v = v * w.v[c] + b.v[c];
          want[i] = round_to(v, dt);
        }
        expect_close(r.v, want, rtol_for(dt) * 2, atol_for(dt) * 4, "batch_norm " + x.type.to_string());
      }
    }
  }
}

TEST(ElementwiseKernels, GroupNorm) {
  uint32_t seed = 1200;
  for (DType dt : {DType::kF32, DType::kF16}) {
    for (const Shape& shape : {Shape{2, 6, 5, 3}, Shape{3, 4}, Shape{2, 32, 16, 16}}) {
      const int64_t C = shape[1], S = prod(shape) / (shape[0] * C);
      for (int64_t G : {int64_t(1), int64_t(2), C}) {
        Tensor x = rand_t(dt, shape, seed++, -2, 4);
        Tensor w = rand_t(dt, {C}, seed++, 0.5, 1.5), b = rand_t(dt, {C}, seed++, -1, 1);
        Attrs a;
        a.set("groups", G);
        a.set("eps", 1e-5);
        Result r = run_op(OpKind::kGroupNorm, {x, w, b}, a);
        std::vector<double> want(x.v.size());
        const int64_t Cg = C / G, block = Cg * S;
        for (int64_t t = 0; t < shape[0] * G; ++t) {
          double mean = 0, var = 0;
          for (int64_t i = 0; i < block; ++i) mean += x.v[size_t(t * block + i)];
          mean /= double(block);
          for (int64_t i = 0; i < block; ++i) var += std::pow(x.v[size_t(t * block + i)] - mean, 2);
          var /= double(block);
          for (int64_t i = 0; i < block; ++i) {
            const size_t c = size_t((t % G) * Cg + i / S);
            want[size_t(t * block + i)] =
                round_to((x.v[size_t(t * block + i)] - mean) / std::sqrt(var + 1e-5) * w.v[c] + b.v[c], dt);
          }
        }
        expect_close(r.v, want, rtol_for(dt) * 2, atol_for(dt) * 4,
                     "group_norm " + x.type.to_string() + " groups " + std::to_string(G));
      }
    }
  }
}

// ==== fused_pointwise ========================================================================

namespace {

// Runs every node of g on its CPU kernel, in order; returns the graph outputs.
std::vector<Bytes> interpret(const Graph& g, const std::vector<Bytes>& inputs) {
  std::map<ValueId, Bytes> vals;
  for (size_t i = 0; i < inputs.size(); ++i) vals[g.inputs()[i]] = inputs[i];
  for (ValueId c : g.constants()) vals[c].assign(g.value(c).data->begin(), g.value(c).data->end());
  for (const auto& n : g.nodes()) {
    auto k = get_backend(Device{}).make_kernel(*n, g, {});
    std::vector<const void*> in;
    for (ValueId v : n->inputs) in.push_back(vals.at(v).data());
    std::vector<TensorType> types;
    for (ValueId v : n->outputs) types.push_back(g.type(v));
    auto outs = run_kernel(*k, in, types);
    for (size_t i = 0; i < outs.size(); ++i) vals[n->outputs[i]] = std::move(outs[i]);
  }
  std::vector<Bytes> out;
  for (ValueId o : g.outputs()) out.push_back(vals.at(o));
  return out;
}

// A pointwise program written once and built two ways: as ordinary nodes of a graph, or as the
// body of one fused_pointwise node.
using Program = std::function<std::vector<ValueId>(Graph& g, const std::vector<ValueId>& inputs)>;

Graph build_unfused(const std::vector<TensorType>& in_types, const Program& prog) {
  Graph g;
  std::vector<ValueId> ins;
  for (size_t i = 0; i < in_types.size(); ++i) ins.push_back(g.add_input(nm("x", i), in_types[i]));
  auto outs = prog(g, ins);
  for (size_t i = 0; i < outs.size(); ++i) g.mark_output(outs[i], nm("y", i));
  return g;
}

Graph build_fused(const std::vector<TensorType>& in_types, const Program& prog) {
  auto body = std::make_shared<Graph>(build_unfused(in_types, prog));
  Graph g;
  std::vector<ValueId> ins;
  for (size_t i = 0; i < in_types.size(); ++i) ins.push_back(g.add_input(nm("x", i), in_types[i]));
  auto outs = g.insert_fused(0, ins, body, "fused");
  for (size_t i = 0; i < outs.size(); ++i) g.mark_output(outs[i], nm("y", i));
  g.verify();
  EXPECT_EQ(g.nodes().size(), 1u);
  return g;
}

ValueId scalar_const(Graph& g, DType dt, double v) {
  Bytes b = encode({v}, dt);
  return g.add_constant("", tt(dt, {}), b.data(), b.size());
}

// Runs both forms on the same random inputs; returns (fused, unfused) outputs as doubles.
std::pair<std::vector<std::vector<double>>, std::vector<std::vector<double>>> run_both(
    const std::vector<Tensor>& inputs, const Program& prog) {
  std::vector<TensorType> types;
  std::vector<Bytes> bytes;
  for (const auto& t : inputs) types.push_back(t.type), bytes.push_back(encode(t.v, t.type.dtype));
  const Graph fused = build_fused(types, prog), plain = build_unfused(types, prog);
  const auto fo = interpret(fused, bytes), po = interpret(plain, bytes);
  std::vector<std::vector<double>> f, p;
  for (size_t i = 0; i < fo.size(); ++i) {
    const TensorType& t = fused.type(fused.outputs()[i]);
    EXPECT_EQ(t, plain.type(plain.outputs()[i]));
    f.push_back(decode(fo[i].data(), t.dtype, t.numel()));
    p.push_back(decode(po[i].data(), t.dtype, t.numel()));
  }
  return {f, p};
}

}  // namespace

TEST(FusedPointwise, F32ChainWithBiasScalarsWhereAndCastEqualsUnfused) {
  Program prog = [](Graph& g, const std::vector<ValueId>& in) {
    const ValueId t1 = g.add_node1(OpKind::kAdd, {in[0], in[1]});  // bias [C] against [N, C]
    const ValueId t2 = g.add_node1(OpKind::kMul, {t1, scalar_const(g, DType::kF32, 0.5)});
    const ValueId t3 = g.add_node1(OpKind::kGelu, {t2});
    const ValueId pos = g.add_node1(OpKind::kGt, {in[0], scalar_const(g, DType::kF32, 0.0)});
    const ValueId t5 = g.add_node1(OpKind::kWhere, {pos, t3, t2});
    Attrs to16;
    to16.set("dtype", DType::kF16);
    const ValueId t6 = g.add_node1(OpKind::kCast, {t5}, to16);
    const ValueId t7 = g.add_node1(OpKind::kSigmoid, {g.add_node1(OpKind::kSub, {in[2], t3})});  // in[2]: [N, 1]
    return std::vector<ValueId>{t3, t6, t7};
  };
  for (const Shape& s : {Shape{300, 257}, Shape{3, 5}, Shape{1, 1}}) {
    const std::vector<Tensor> ins = {rand_t(DType::kF32, s, 1, -3, 3), rand_t(DType::kF32, {s[1]}, 2),
                                     rand_t(DType::kF32, {s[0], 1}, 3)};
    auto [fused, plain] = run_both(ins, prog);
    ASSERT_EQ(fused.size(), 3u);
    for (size_t k = 0; k < fused.size(); ++k) EXPECT_EQ(fused[k], plain[k]) << "output " << k;  // bit for bit
  }
}

TEST(FusedPointwise, HalfInputsBroadcastBothWays) {
  Program prog = [](Graph& g, const std::vector<ValueId>& in) {
    const ValueId s = g.add_node1(OpKind::kAdd, {in[0], in[1]});  // [2,1,3] + [4,1] -> [2,4,3]
    const ValueId r = g.add_node1(OpKind::kRelu, {s});
    Attrs to32;
    to32.set("dtype", DType::kF32);
    return std::vector<ValueId>{g.add_node1(OpKind::kSigmoid, {r}), g.add_node1(OpKind::kCast, {r}, to32)};
  };
  for (DType dt : {DType::kF16, DType::kBF16}) {
    auto [fused, plain] = run_both({rand_t(dt, {2, 1, 3}, 4, -2, 2), rand_t(dt, {4, 1}, 5, -2, 2)}, prog);
    // Unfused rounds each intermediate to the 16-bit dtype; fused keeps f32 between ops.
    for (size_t k = 0; k < fused.size(); ++k) expect_close(fused[k], plain[k], rtol_for(dt), atol_for(dt));
  }
}

TEST(FusedPointwise, IntegerBodiesKeepIntegerSemantics) {
  Program prog = [](Graph& g, const std::vector<ValueId>& in) {
    const ValueId d = g.add_node1(OpKind::kDiv, {in[0], in[1]});  // truncates; x / 0 == 0
    const ValueId s = g.add_node1(OpKind::kAdd, {d, in[0]});
    const ValueId m = g.add_node1(OpKind::kMaximum, {s, scalar_const(g, DType::kI64, 3)});
    const ValueId lt = g.add_node1(OpKind::kLt, {in[0], in[1]});
    return std::vector<ValueId>{m, lt};
  };
  Tensor a = rand_t(DType::kI64, {5, 7}, 6, -1000, 1000), b = rand_t(DType::kI64, {7}, 7, -9, 9);
  b.v[0] = 0;
  auto [fused, plain] = run_both({a, b}, prog);
  EXPECT_EQ(fused, plain);

  Program wraps = [](Graph& g, const std::vector<ValueId>& in) {
    const ValueId s = g.add_node1(OpKind::kAdd, {in[0], in[1]});  // i8 sums wrap
    const ValueId n = g.add_node1(OpKind::kNeg, {s});
    Attrs to;
    to.set("dtype", DType::kU8);
    return std::vector<ValueId>{n, g.add_node1(OpKind::kCast, {g.add_node1(OpKind::kMul, {n, in[1]})}, to)};
  };
  auto [fw, pw_] = run_both({rand_t(DType::kI8, {64}, 8, -128, 128), rand_t(DType::kI8, {64}, 9, -128, 128)}, wraps);
  EXPECT_EQ(fw, pw_);
}

TEST(FusedPointwise, ZeroDimGroupAndRejectsNonPointwiseBodies) {
  Program prog = [](Graph& g, const std::vector<ValueId>& in) {
    return std::vector<ValueId>{g.add_node1(OpKind::kExp, {g.add_node1(OpKind::kNeg, {in[0]})})};
  };
  auto [fused, plain] = run_both({from_values(DType::kF32, {}, {0.75})}, prog);
  EXPECT_EQ(fused, plain);
  EXPECT_NEAR(fused[0][0], std::exp(-0.75), 1e-6);

  Program bad = [](Graph& g, const std::vector<ValueId>& in) {
    Attrs a;
    a.set("axis", int64_t{0});
    return std::vector<ValueId>{g.add_node1(OpKind::kSoftmax, {in[0]}, a)};
  };
  const Graph g = build_fused({tt(DType::kF32, {4})}, bad);
  expect_error([&] { get_backend(Device{}).make_kernel(*g.nodes()[0], g, {}); }, ErrorCode::kUnsupported,
               {"fused_pointwise", "softmax", "not pointwise"});
}

// ==== kernels shared by several execution contexts ===========================================

TEST(ElementwiseKernels, ConcurrentRunsWithSeparateWorkspaces) {
  Graph g;
  const ValueId x = g.add_input("x", tt(DType::kF16, {64, 700}));
  Attrs a;
  a.set("axis", int64_t{1});
  const ValueId y = g.add_node1(OpKind::kSoftmax, {x}, a);
  auto k = get_backend(Device{}).make_kernel(*g.nodes().back(), g, {});
  ASSERT_GT(k->workspace_size(), 0u);  // f16 rows are widened in scratch
  const Tensor in = rand_t(DType::kF16, {64, 700}, 12, -4, 4);
  const Bytes bytes = encode(in.v, DType::kF16);
  const Bytes want = run_kernel(*k, {bytes.data()}, {g.type(y)})[0];
  std::vector<std::thread> threads;
  std::vector<char> same(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      bool ok = true;
      for (int rep = 0; rep < 20; ++rep) ok = ok && run_kernel(*k, {bytes.data()}, {g.type(y)})[0] == want;
      same[size_t(t)] = ok;
    });
  for (auto& th : threads) th.join();
  for (char s : same) EXPECT_TRUE(s);
  EXPECT_FALSE(k->describe().empty());
}

TEST(ElementwiseKernels, EmptyTensorsRunWithoutTouchingMemory) {
  Tensor e = rand_t(DType::kF32, {0, 3}, 1);
  EXPECT_TRUE(run_op(OpKind::kGelu, {e}).v.empty());
  EXPECT_TRUE(run_op(OpKind::kAdd, {e, rand_t(DType::kF32, {3}, 2)}).v.empty());
  EXPECT_TRUE(run_op(OpKind::kWhere, {rand_t(DType::kBool, {1, 3}, 3), e, e}).v.empty());
  Attrs cast;
  cast.set("dtype", DType::kI8);
  EXPECT_TRUE(run_op(OpKind::kCast, {e}, cast).v.empty());
  Attrs ax;
  ax.set("axis", int64_t{1});
  EXPECT_TRUE(run_op(OpKind::kSoftmax, {e}, ax).v.empty());
  EXPECT_TRUE(run_op(OpKind::kLayerNorm, {e}).v.empty());
  Program prog = [](Graph& g, const std::vector<ValueId>& in) {
    return std::vector<ValueId>{g.add_node1(OpKind::kRelu, {g.add_node1(OpKind::kNeg, {in[0]})})};
  };
  auto [fused, plain] = run_both({e}, prog);
  EXPECT_TRUE(fused[0].empty());
}

TEST(ElementwiseKernels, ArgmaxNaNAndSaturatingIntegerClamp) {
  Attrs a;
  a.set("axis", int64_t{1});
  Tensor x = from_values(DType::kF32, {2, 4}, {1, kNaN, 5, kNaN, 2, 7, 7, 1});
  EXPECT_EQ(run_op(OpKind::kArgmax, {x}, a).v, (std::vector<double>{1, 1}));  // a NaN counts as largest
  Attrs wide;
  wide.set("min", -1e30);
  wide.set("max", 1e30);
  Tensor i8 = rand_t(DType::kI8, {40}, 5, -128, 128);
  EXPECT_EQ(run_op(OpKind::kClamp, {i8}, wide).v, i8.v);
  Attrs only_max;
  only_max.set("max", -0.5);  // the integers <= -0.5: at most -1
  Tensor i64 = rand_t(DType::kI64, {40}, 6, -5, 5);
  std::vector<double> want;
  for (double v : i64.v) want.push_back(std::min(v, -1.0));
  EXPECT_EQ(run_op(OpKind::kClamp, {i64}, only_max).v, want);
}
