// The data-movement ops (shape, gather and generator families): shape rules and CPU kernels.
//
// Every kernel runs on random data and is compared byte for byte with a naive reference
// written here from the op's definition: for each output element, the multi-index of the
// input element it comes from (or the fill value). Movement is exact, so there is no
// tolerance. Shapes are odd, include empty dims, and are large enough in places to reach the
// tiled and multi-threaded paths. Bad attributes must be rejected with messages that name the
// op and the cause; out-of-range indices must throw, not crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <thread>

#include "kiln/kiln.h"
#include "tests/cpp/error_test_util.h"

using namespace kiln;

namespace {

using Shape = std::vector<int64_t>;

struct Tensor {
  TensorType type;
  std::vector<uint64_t> storage;  // 8-byte aligned bytes
  explicit Tensor(TensorType t) : type(std::move(t)), storage((type.nbytes() + 7) / 8 + 1, 0xCDCDCDCDCDCDCDCDull) {}
  uint8_t* bytes() { return reinterpret_cast<uint8_t*>(storage.data()); }
  const uint8_t* bytes() const { return reinterpret_cast<const uint8_t*>(storage.data()); }
  size_t esz() const { return dtype_size(type.dtype); }
  int64_t numel() const { return type.numel(); }
};

std::mt19937& rng() {
  static std::mt19937 r(1234);
  return r;
}

int64_t rand_int(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng()); }

// Bytes of v in dtype t, from the definition of each dtype.
uint64_t scalar_bits(DType t, double v) {
  uint64_t b = 0;
  auto put = [&](auto x) { std::memcpy(&b, &x, sizeof(x)); };
  switch (t) {
    case DType::kF32: put(float(v)); break;
    case DType::kF64: put(v); break;
    case DType::kF16: put(float_to_half(float(v))); break;
    case DType::kBF16: put(float_to_bf16(float(v))); break;
    case DType::kI64: put(int64_t(v)); break;
    case DType::kI32: put(int32_t(v)); break;
    case DType::kI8: put(int8_t(v)); break;
    case DType::kU8: put(uint8_t(v)); break;
    case DType::kBool: put(uint8_t(v != 0.0)); break;
  }
  return b;
}

Tensor random_tensor(DType t, const Shape& shape) {
  Tensor x(TensorType(t, shape));
  for (int64_t i = 0; i < x.numel(); ++i) {
    double v = is_floating(t) ? std::uniform_real_distribution<double>(-100, 100)(rng()) : double(rand_int(-100, 100));
    if (t == DType::kBool) v = double(rand_int(0, 1));
    if (t == DType::kU8) v = double(rand_int(0, 255));
    uint64_t bits = scalar_bits(t, v);
    std::memcpy(x.bytes() + size_t(i) * x.esz(), &bits, x.esz());
  }
  return x;
}

Tensor index_tensor(DType t, const Shape& shape, int64_t lo, int64_t hi) {
  Tensor x(TensorType(t, shape));
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t v = rand_int(lo, hi);
    if (t == DType::kI64) reinterpret_cast<int64_t*>(x.bytes())[i] = v;
    else reinterpret_cast<int32_t*>(x.bytes())[i] = int32_t(v);
  }
  return x;
}

int64_t read_index(const Tensor& t, int64_t i) {
  return t.type.dtype == DType::kI64 ? reinterpret_cast<const int64_t*>(t.bytes())[i]
                                     : reinterpret_cast<const int32_t*>(t.bytes())[i];
}

Shape unravel(int64_t flat, const Shape& shape) {
  Shape idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) idx[k] = flat % shape[k], flat /= shape[k];
  return idx;
}

int64_t ravel(const Shape& idx, const Shape& shape) {
  int64_t f = 0;
  for (size_t k = 0; k < shape.size(); ++k) f = f * shape[k] + idx[k];
  return f;
}

std::string input_name(size_t i) {
  std::string s = "x";
  s += std::to_string(i);
  return s;
}

std::unique_ptr<Kernel> build(const Graph& g) {
  return get_backend(Device{}).make_kernel(*g.nodes().back(), g, {});
}

void run_kernel(const Kernel& k, const std::vector<const Tensor*>& ins, std::vector<Tensor>& outs) {
  std::vector<const void*> ip;
  std::vector<void*> op;
  for (const Tensor* t : ins) ip.push_back(t->bytes());
  for (Tensor& t : outs) op.push_back(t.bytes());
  std::vector<uint64_t> ws(k.workspace_size() / 8 + 8);
  RunContext ctx;
  ctx.workspace = ws.data();
  ctx.workspace_size = ws.size() * 8;
  k.run(ip.data(), op.data(), ctx);
}

// Builds a one-node graph over `ins`, runs its CPU kernel and returns the outputs.
std::vector<Tensor> run_op(OpKind op, const std::vector<const Tensor*>& ins, const Attrs& attrs) {
  Graph g;
  std::vector<ValueId> ids;
  for (size_t i = 0; i < ins.size(); ++i) ids.push_back(g.add_input(input_name(i), ins[i]->type));
  auto out_ids = g.add_node(op, ids, attrs);
  std::vector<Tensor> outs;
  for (ValueId o : out_ids) outs.emplace_back(g.type(o));
  run_kernel(*build(g), ins, outs);
  return outs;
}

// Expected output: element i comes from src element source(idx(i)), or is `fill` when the
// source is empty (std::nullopt).
using Source = std::function<std::optional<int64_t>(const Shape& out_idx)>;

void expect_moved(const Tensor& out, const Tensor& src, const Source& source, uint64_t fill = 0,
                  const std::string& what = "") {
  const Shape shape = out.type.shape();
  const size_t esz = out.esz();
  for (int64_t i = 0; i < out.numel(); ++i) {
    const Shape idx = unravel(i, shape);
    std::optional<int64_t> s = source(idx);
    const uint8_t* want = s ? src.bytes() + size_t(*s) * esz : reinterpret_cast<const uint8_t*>(&fill);
    if (std::memcmp(out.bytes() + size_t(i) * esz, want, esz) != 0) {
      ADD_FAILURE() << what << ": element " << i << " of " << out.type.to_string() << " differs (source "
                    << (s ? std::to_string(*s) : "fill") << ")";
      return;
    }
  }
}

Attrs ints_attr(const std::string& key, Shape v) {
  Attrs a;
  a.set(key, std::move(v));
  return a;
}

std::string str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ',';
    r += std::to_string(s[i]);
  }
  return r + "]";
}

Shape random_shape(int rank, int64_t lo, int64_t hi) {
  Shape s(static_cast<size_t>(rank));
  for (auto& e : s) e = rand_int(lo, hi);
  return s;
}

using kiln::test::expect_error;

// A graph with inputs of `types` and one node of op; used for shape-rule errors.
void add_to_graph(OpKind op, const std::vector<TensorType>& types, const Attrs& a) {
  Graph g;
  std::vector<ValueId> ids;
  for (size_t i = 0; i < types.size(); ++i) ids.push_back(g.add_input(input_name(i), types[i]));
  g.add_node(op, ids, a);
}

const DType kDTypes[] = {DType::kF32, DType::kF16, DType::kI64, DType::kBool};

}  // namespace

// ---- shape family ------------------------------------------------------------------------

TEST(ShapeOps, ReshapeAndCopyPreserveBytesInOrder) {
  for (DType dt : kDTypes)
    for (const Shape& s : {Shape{7}, Shape{3, 5, 2}, Shape{4, 0, 3}, Shape{}, Shape{1, 257, 301}}) {
      Tensor x = random_tensor(dt, s);
      Shape flat{x.numel()};
      Shape to = s.size() >= 2 ? Shape{s[0] * s[1]} : flat;
      for (size_t k = 2; k < s.size(); ++k) to.push_back(s[k]);
      auto y = run_op(OpKind::kReshape, {&x}, ints_attr("shape", to));
      EXPECT_EQ(y[0].type.shape(), to);
      expect_moved(y[0], x, [&](const Shape& i) { return ravel(i, to); }, 0, "reshape " + str(s));
      auto c = run_op(OpKind::kCopy, {&x}, {});
      EXPECT_EQ(c[0].type, x.type);
      expect_moved(c[0], x, [&](const Shape& i) { return ravel(i, s); }, 0, "copy " + str(s));
    }
}

static void check_permute(DType dt, const Shape& s, const Shape& perm) {
  Tensor x = random_tensor(dt, s);
  auto y = run_op(OpKind::kPermute, {&x}, ints_attr("perm", perm));
  Shape expect(s.size());
  for (size_t k = 0; k < s.size(); ++k) expect[k] = s[size_t(perm[k])];
  ASSERT_EQ(y[0].type.shape(), expect);
  expect_moved(y[0], x, [&](const Shape& o) {
    Shape i(s.size());
    for (size_t k = 0; k < s.size(); ++k) i[size_t(perm[k])] = o[k];
    return ravel(i, s);
  }, 0, std::string("permute ") + dtype_name(dt) + str(s) + " by " + str(perm));
}

TEST(ShapeOps, PermuteRank1To5MatchesReference) {
  for (DType dt : kDTypes)
    for (int rank = 1; rank <= 5; ++rank)
      for (int trial = 0; trial < 6; ++trial) {
        Shape s = random_shape(rank, 1, rank <= 3 ? 9 : 5);
        if (trial == 5) s[size_t(rand_int(0, rank - 1))] = 0;
        Shape perm(static_cast<size_t>(rank));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng());
        check_permute(dt, s, perm);
      }
}

TEST(ShapeOps, PermuteLargeTiledAndThreaded) {
  // Transposes that reach the tiled path (last dim moved) and the threaded row path.
  check_permute(DType::kF32, {257, 129}, {1, 0});
  check_permute(DType::kF16, {3, 200, 301}, {2, 0, 1});
  check_permute(DType::kI64, {2, 33, 65, 17}, {0, 2, 3, 1});
  check_permute(DType::kBool, {130, 3, 150}, {2, 1, 0});
  check_permute(DType::kF32, {4, 96, 3, 200}, {0, 2, 1, 3});
  check_permute(DType::kF32, {1, 64, 1, 40}, {3, 2, 1, 0});
}

TEST(ShapeOps, ExpandBroadcastsUnitDims) {
  for (DType dt : kDTypes)
    for (int trial = 0; trial < 12; ++trial) {
      const int rank = int(rand_int(1, 4));
      Shape to = random_shape(rank, 1, 6), s = to;
      for (auto& e : s)
        if (rand_int(0, 1)) e = 1;
      if (trial == 11) to[0] = 0, s[0] = 1;
      Tensor x = random_tensor(dt, s);
      auto y = run_op(OpKind::kExpand, {&x}, ints_attr("shape", to));
      ASSERT_EQ(y[0].type.shape(), to);
      expect_moved(y[0], x, [&](const Shape& o) {
        Shape i = o;
        for (size_t k = 0; k < s.size(); ++k) i[k] = s[k] == 1 ? 0 : o[k];
        return ravel(i, s);
      }, 0, "expand " + str(s) + " to " + str(to));
    }
  Tensor big = random_tensor(DType::kF32, {300, 1});
  auto y = run_op(OpKind::kExpand, {&big}, ints_attr("shape", {300, 400}));
  expect_moved(y[0], big, [](const Shape& o) { return o[0]; }, 0, "expand big");
}

TEST(ShapeOps, SliceWithStepsOnEveryAxis) {
  for (DType dt : kDTypes)
    for (int trial = 0; trial < 16; ++trial) {
      const int rank = int(rand_int(1, 4));
      Shape s = random_shape(rank, 0, 9);
      const int64_t axis = rand_int(0, rank - 1), dim = s[size_t(axis)];
      const int64_t start = rand_int(0, dim), end = rand_int(start, dim), step = rand_int(1, 4);
      Attrs a;
      a.set("axis", axis), a.set("start", start), a.set("end", end), a.set("step", step);
      Tensor x = random_tensor(dt, s);
      auto y = run_op(OpKind::kSlice, {&x}, a);
      Shape expect = s;
      expect[size_t(axis)] = (end - start + step - 1) / step;
      ASSERT_EQ(y[0].type.shape(), expect);
      expect_moved(y[0], x, [&](const Shape& o) {
        Shape i = o;
        i[size_t(axis)] = start + o[size_t(axis)] * step;
        return ravel(i, s);
      }, 0, "slice " + str(s));
    }
}

// Element by element: the input holding position o[axis] supplies the element.
static void check_concat(const Tensor& y, const std::vector<Tensor>& xs, int64_t axis) {
  const Shape ys = y.type.shape();
  ASSERT_EQ(y.type.dtype, xs[0].type.dtype);
  for (int64_t f = 0; f < y.numel(); ++f) {
    Shape o = unravel(f, ys);
    size_t i = 0;
    for (int64_t& pos = o[size_t(axis)]; pos >= xs[i].type.dims[size_t(axis)].extent; ++i)
      pos -= xs[i].type.dims[size_t(axis)].extent;
    ASSERT_EQ(std::memcmp(y.bytes() + f * y.esz(), xs[i].bytes() + ravel(o, xs[i].type.shape()) * y.esz(), y.esz()), 0)
        << "concat element " << f << " of " << y.type.to_string();
  }
}

TEST(ShapeOps, ConcatAndSplitMatchReference) {
  for (DType dt : kDTypes)
    for (int trial = 0; trial < 10; ++trial) {
      const int rank = int(rand_int(1, 4));
      const Shape base = random_shape(rank, 1, 6);
      const int64_t axis = rand_int(0, rank - 1);
      std::vector<Tensor> xs;
      Shape sizes;
      for (int i = 0, n = int(rand_int(1, 4)); i < n; ++i) {
        Shape s = base;
        s[size_t(axis)] = rand_int(0, 5);
        sizes.push_back(s[size_t(axis)]);
        xs.push_back(random_tensor(dt, s));
      }
      std::vector<const Tensor*> ptrs;
      for (auto& t : xs) ptrs.push_back(&t);
      Attrs a;
      a.set("axis", axis);
      auto y = run_op(OpKind::kConcat, ptrs, a);
      check_concat(y[0], xs, axis);
      a.set("sizes", sizes);
      auto parts = run_op(OpKind::kSplit, {&y[0]}, a);
      ASSERT_EQ(parts.size(), xs.size());
      for (size_t i = 0; i < xs.size(); ++i) {
        ASSERT_EQ(parts[i].type.shape(), xs[i].type.shape());
        expect_moved(parts[i], xs[i], [&](const Shape& o) { return ravel(o, xs[i].type.shape()); }, 0, "split");
      }
    }
  std::vector<Tensor> big;  // large enough for the threaded path
  big.push_back(random_tensor(DType::kF32, {2, 300, 200}));
  big.push_back(random_tensor(DType::kF32, {2, 300, 101}));
  Attrs at;
  at.set("axis", int64_t{2});
  check_concat(run_op(OpKind::kConcat, {&big[0], &big[1]}, at)[0], big, 2);
}

static void check_pad(DType dt, const Shape& s, const Shape& pads, const std::string& mode, double value) {
  Attrs a = ints_attr("pads", pads);
  a.set("mode", mode);
  a.set("value", value);
  Tensor x = random_tensor(dt, s);
  auto y = run_op(OpKind::kPad, {&x}, a);
  expect_moved(y[0], x, [&](const Shape& o) -> std::optional<int64_t> {
    Shape i(s.size());
    for (size_t k = 0; k < s.size(); ++k) {
      int64_t v = o[k] - pads[2 * k], n = s[k];
      if (mode == "constant" && (v < 0 || v >= n)) return std::nullopt;
      if (mode == "reflect") v = v < 0 ? -v : (v >= n ? 2 * (n - 1) - v : v);
      if (mode == "replicate") v = std::min(std::max<int64_t>(v, 0), n - 1);
      i[k] = v;
    }
    return ravel(i, s);
  }, scalar_bits(dt, value), "pad " + mode + " " + dtype_name(dt) + str(s) + " by " + str(pads));
}

TEST(ShapeOps, PadConstantReflectReplicate) {
  for (DType dt : kDTypes)
    for (const std::string mode : {"constant", "reflect", "replicate"})
      for (int trial = 0; trial < 8; ++trial) {
        const int rank = int(rand_int(1, 4));
        Shape s = random_shape(rank, 1, 6), pads;
        for (int64_t e : s)
          for (int side = 0; side < 2; ++side) pads.push_back(mode == "reflect" ? rand_int(0, e - 1) : rand_int(0, 3));
        check_pad(dt, s, pads, mode, dt == DType::kBool ? 1.0 : -7.0);
      }
  check_pad(DType::kF32, {2, 0, 3}, {1, 0, 2, 1, 0, 2}, "constant", 2.5);
  check_pad(DType::kF16, {3, 130, 257}, {0, 0, 3, 2, 4, 5}, "reflect", 0.0);
  check_pad(DType::kI64, {}, {}, "constant", 1.0);
}

// ---- gather family -----------------------------------------------------------------------

TEST(GatherOps, GatherMatchesTorchGatherWithNegativeIndices) {
  for (DType dt : kDTypes)
    for (DType it : {DType::kI64, DType::kI32})
      for (int trial = 0; trial < 8; ++trial) {
        const int rank = int(rand_int(1, 4));
        const Shape s = random_shape(rank, 1, 6);
        const int64_t axis = rand_int(0, rank - 1);
        Shape is = s;
        for (size_t k = 0; k < is.size(); ++k) is[k] = int64_t(k) == axis ? rand_int(0, 8) : rand_int(1, s[k]);
        Tensor x = random_tensor(dt, s);
        Tensor idx = index_tensor(it, is, -s[size_t(axis)], s[size_t(axis)] - 1);
        Attrs a;
        a.set("axis", axis);
        auto y = run_op(OpKind::kGather, {&x, &idx}, a);
        ASSERT_EQ(y[0].type.shape(), is);
        ASSERT_EQ(y[0].type.dtype, dt);
        expect_moved(y[0], x, [&](const Shape& o) {
          Shape i = o;
          int64_t v = read_index(idx, ravel(o, is));
          i[size_t(axis)] = v < 0 ? v + s[size_t(axis)] : v;
          return ravel(i, s);
        }, 0, "gather axis " + std::to_string(axis) + " of " + str(s));
      }
}

TEST(GatherOps, GatherReadsItsIndexBroadcastInBroadcastDims) {
  for (DType it : {DType::kI64, DType::kI32})
    for (int trial = 0; trial < 12; ++trial) {
      const int rank = int(rand_int(2, 4));
      const Shape s = random_shape(rank, 2, 6);
      const int64_t axis = rand_int(0, rank - 1);
      Shape is = s, os = s;
      std::vector<int64_t> dims;
      for (int64_t k = 0; k < rank; ++k) {
        if (k == axis) {
          is[size_t(k)] = os[size_t(k)] = rand_int(1, 8);
        } else if (rand_int(0, 1) == 1) {
          is[size_t(k)] = 1;  // broadcast: the output keeps x's extent
          dims.push_back(k);
        } else {
          is[size_t(k)] = os[size_t(k)] = rand_int(1, s[size_t(k)]);
        }
      }
      Tensor x = random_tensor(DType::kF32, s);
      Tensor idx = index_tensor(it, is, -s[size_t(axis)], s[size_t(axis)] - 1);
      Attrs a;
      a.set("axis", axis);
      a.set("broadcast", dims);
      auto y = run_op(OpKind::kGather, {&x, &idx}, a);
      ASSERT_EQ(y[0].type.shape(), os);
      expect_moved(
          y[0], x,
          [&](const Shape& o) {
            Shape at = o;  // the index element this output reads: 0 in the broadcast dims
            for (int64_t d : dims) at[size_t(d)] = 0;
            Shape i = o;
            const int64_t v = read_index(idx, ravel(at, is));
            i[size_t(axis)] = v < 0 ? v + s[size_t(axis)] : v;
            return ravel(i, s);
          },
          0, "broadcast gather axis " + std::to_string(axis) + " of " + str(s));
    }
}

TEST(GatherOps, BroadcastDimsAreCheckedByTheShapeRule) {
  Tensor x = random_tensor(DType::kF32, {4, 5});
  Tensor idx = index_tensor(DType::kI64, {2, 3}, 0, 4);
  Attrs a;
  a.set("axis", int64_t{1});
  a.set("broadcast", std::vector<int64_t>{0});
  expect_error([&] { run_op(OpKind::kGather, {&x, &idx}, a); }, ErrorCode::kShapeMismatch,
               {"gather", "extent 1 in broadcast dim 0"});
  a.set("broadcast", std::vector<int64_t>{1});
  expect_error([&] { run_op(OpKind::kGather, {&x, &idx}, a); }, ErrorCode::kInvalidArgument,
               {"gather", "broadcast dim 1", "other than axis 1"});
}

TEST(GatherOps, IndexSelectMatchesReference) {
  for (DType dt : kDTypes)
    for (DType it : {DType::kI64, DType::kI32})
      for (int trial = 0; trial < 8; ++trial) {
        const int rank = int(rand_int(1, 4));
        const Shape s = random_shape(rank, 1, 6);
        const int64_t axis = rand_int(0, rank - 1), dim = s[size_t(axis)];
        Tensor x = random_tensor(dt, s);
        Tensor idx = index_tensor(it, {rand_int(0, 7)}, -dim, dim - 1);
        Attrs a;
        a.set("axis", axis);
        auto y = run_op(OpKind::kIndexSelect, {&x, &idx}, a);
        expect_moved(y[0], x, [&](const Shape& o) {
          Shape i = o;
          int64_t v = read_index(idx, o[size_t(axis)]);
          i[size_t(axis)] = v < 0 ? v + dim : v;
          return ravel(i, s);
        }, 0, "index_select axis " + std::to_string(axis) + " of " + str(s));
      }
}

TEST(GatherOps, OutOfRangeIndicesThrowNamingTheIndex) {
  Tensor x = random_tensor(DType::kF32, {3, 4});
  Attrs a;
  a.set("axis", int64_t{1});
  for (int64_t bad : {4, -5, 1000}) {
    Tensor idx = index_tensor(DType::kI64, {3, 2}, 0, 3);
    reinterpret_cast<int64_t*>(idx.bytes())[3] = bad;
    expect_error([&] { run_op(OpKind::kGather, {&x, &idx}, a); }, ErrorCode::kInvalidArgument,
                 {"gather", "index " + std::to_string(bad), "size 4"});
    Tensor sel = index_tensor(DType::kI32, {5}, 0, 3);
    reinterpret_cast<int32_t*>(sel.bytes())[4] = int32_t(bad);
    expect_error([&] { run_op(OpKind::kIndexSelect, {&x, &sel}, a); }, ErrorCode::kInvalidArgument,
                 {"index_select", "index " + std::to_string(bad)});
  }
  Tensor empty = random_tensor(DType::kF32, {3, 0});
  Tensor idx = index_tensor(DType::kI64, {2}, 0, 0);
  expect_error([&] { run_op(OpKind::kIndexSelect, {&empty, &idx}, a); }, ErrorCode::kInvalidArgument,
               {"index 0", "size 0"});
}

// ---- generator family ----------------------------------------------------------------------

static std::vector<Tensor> run_generator(OpKind op, const Attrs& a) { return run_op(op, {}, a); }

TEST(Generators, ArangeEveryDTypeComputedInDoubleThenCast) {
  struct Range { double start, end, step; };
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType dt = static_cast<DType>(i);
    for (Range r : {Range{0, 7, 1}, Range{-3, 11, 2.5}, Range{10, -4, -3}, Range{1, 1, 1}, Range{0.5, 3, 0.25}}) {
      if (dt == DType::kU8 && std::min(r.start, r.end) < 0) continue;  // rejected: not representable
      Attrs a;
      a.set("start", r.start), a.set("end", r.end), a.set("step", r.step), a.set("dtype", dt);
      auto y = run_generator(OpKind::kArange, a);
      const int64_t n = int64_t(std::ceil((r.end - r.start) / r.step));
      ASSERT_EQ(y[0].type, TensorType(dt, {n}));
      for (int64_t k = 0; k < n; ++k) {
        const uint64_t want = scalar_bits(dt, r.start + double(k) * r.step);
        EXPECT_EQ(std::memcmp(y[0].bytes() + k * y[0].esz(), &want, y[0].esz()), 0)
            << "arange " << dtype_name(dt) << " element " << k;
      }
    }
  }
  Attrs ints;  // integer attributes and the default start / step
  ints.set("end", int64_t{5}), ints.set("dtype", DType::kI64);
  auto y = run_generator(OpKind::kArange, ints);
  ASSERT_EQ(y[0].numel(), 5);
  for (int64_t k = 0; k < 5; ++k) EXPECT_EQ(reinterpret_cast<const int64_t*>(y[0].bytes())[k], k);
  Attrs big;
  big.set("end", 200000.0), big.set("dtype", DType::kF32);
  auto b = run_generator(OpKind::kArange, big);
  for (int64_t k = 0; k < 200000; k += 997) EXPECT_EQ(reinterpret_cast<const float*>(b[0].bytes())[k], float(k));
}

TEST(Generators, FullEveryDTypeCastsTheValue) {
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType dt = static_cast<DType>(i);
    for (double v : {3.75, -2.0, 0.0, 1.0}) {
      if (dt == DType::kU8 && v < 0) continue;
      Attrs a = ints_attr("shape", {3, 0, 2});
      a.set("value", v), a.set("dtype", dt);
      EXPECT_EQ(run_generator(OpKind::kFull, a)[0].type, TensorType(dt, {3, 0, 2}));
      a.set("shape", Shape{5, 7, 3});
      auto y = run_generator(OpKind::kFull, a);
      const uint64_t want = scalar_bits(dt, v);
      for (int64_t k = 0; k < y[0].numel(); ++k)
        ASSERT_EQ(std::memcmp(y[0].bytes() + k * y[0].esz(), &want, y[0].esz()), 0)
            << "full " << dtype_name(dt) << " " << v << " element " << k;
    }
  }
  Attrs exact = ints_attr("shape", {300, 500});  // an i64 value stays exact, beyond 2^53
  exact.set("value", int64_t{(int64_t(1) << 60) + 1}), exact.set("dtype", DType::kI64);
  auto y = run_generator(OpKind::kFull, exact);
  for (int64_t k = 0; k < y[0].numel(); k += 131)
    ASSERT_EQ(reinterpret_cast<const int64_t*>(y[0].bytes())[k], (int64_t(1) << 60) + 1);
}

// ---- shape rules ---------------------------------------------------------------------------

static TensorType symbolic(DType dt, const Shape& s, size_t sym_dim) {
  TensorType t(dt, s);
  t.dims[sym_dim].symbol = "N";
  t.dims[sym_dim].min = 1;
  t.dims[sym_dim].max = 64;
  return t;
}

TEST(ShapeRules, OutputDimsKeepTheSymbolOfTheSameInputDim) {
  const TensorType x = symbolic(DType::kF16, {4, 6, 5}, 0);
  const Dim& n = x.dims[0];
  auto one = [&](OpKind op, const Attrs& a, std::vector<const TensorType*> in = {}) {
    if (in.empty()) in = {&x};
    return infer_types(op, in, a)[0];
  };
  EXPECT_EQ(one(OpKind::kPermute, ints_attr("perm", {2, 0, 1})).dims[1], n);
  EXPECT_EQ(one(OpKind::kCopy, {}), x);
  EXPECT_EQ(one(OpKind::kReshape, ints_attr("shape", {4, 30})).dims[0], n);
  EXPECT_TRUE(one(OpKind::kReshape, ints_attr("shape", {24, 5})).dims[0].is_static());
  Attrs sl;
  sl.set("axis", int64_t{1}), sl.set("start", int64_t{1}), sl.set("end", int64_t{6}), sl.set("step", int64_t{2});
  TensorType s = one(OpKind::kSlice, sl);
  EXPECT_EQ(s.dims[0], n);
  EXPECT_EQ(s.dims[1].extent, 3);
  Attrs cat;
  cat.set("axis", int64_t{2});
  EXPECT_EQ(one(OpKind::kConcat, cat, {&x, &x}).dims[0], n);
  EXPECT_EQ(one(OpKind::kConcat, cat, {&x, &x}).dims[2].extent, 10);
  Attrs pad = ints_attr("pads", {0, 0, 1, 2, 0, 3});
  TensorType p = one(OpKind::kPad, pad);
  EXPECT_EQ(p.dims[0], n);
  EXPECT_EQ(p.shape(), (Shape{4, 9, 8}));
  const TensorType one_dim = symbolic(DType::kF32, {4, 1}, 0);
  EXPECT_EQ(infer_types(OpKind::kExpand, {&one_dim}, ints_attr("shape", {4, 7}))[0].dims[0], n);
  const TensorType idx = symbolic(DType::kI64, {9}, 0);
  Attrs ax;
  ax.set("axis", int64_t{1});
  TensorType sel = infer_types(OpKind::kIndexSelect, {&x, &idx}, ax)[0];
  EXPECT_EQ(sel.dims[0], n);
  EXPECT_EQ(sel.dims[1], idx.dims[0]);
  EXPECT_EQ(sel.dtype, DType::kF16);
}

TEST(ShapeRules, RejectBadAttributesWithClearMessages) {
  const TensorType x(DType::kF32, {2, 3, 4});
  auto bad = [&](OpKind op, const Attrs& a, ErrorCode code, const std::vector<std::string>& parts,
                 std::vector<TensorType> in = {}) {
    if (in.empty()) in = {x};
    expect_error([&] { add_to_graph(op, in, a); }, code, parts);
  };
  auto bad_generator = [&](OpKind op, const Attrs& a, const std::vector<std::string>& parts) {
    expect_error([&] { add_to_graph(op, {}, a); }, ErrorCode::kInvalidArgument, parts);
  };
  auto attrs = [](std::initializer_list<std::pair<const char*, AttrValue>> kv) {
    Attrs a;
    for (auto& [k, v] : kv) a.set(k, v);
    return a;
  };
  using EC = ErrorCode;
  bad(OpKind::kReshape, ints_attr("shape", {5, 5}), EC::kShapeMismatch, {"reshape", "24 elements", "[5,5]"});
  bad(OpKind::kReshape, ints_attr("shape", {-1, 4}), EC::kInvalidArgument, {"reshape", "negative extent -1"});
  bad(OpKind::kReshape, {}, EC::kInvalidArgument, {"reshape", "missing attribute 'shape'"});
  bad(OpKind::kPermute, ints_attr("perm", {0, 0, 1}), EC::kInvalidArgument, {"permute", "not a permutation"});
  bad(OpKind::kPermute, ints_attr("perm", {1, 0}), EC::kInvalidArgument, {"permute", "rank 3"});
  bad(OpKind::kExpand, ints_attr("shape", {2, 6, 4}), EC::kShapeMismatch, {"expand", "dim 1 is 3"});
  bad(OpKind::kExpand, ints_attr("shape", {2, 3}), EC::kInvalidArgument, {"expand", "rank"});
  auto slice = [&](int64_t axis, int64_t start, int64_t end, int64_t step) {
    return attrs({{"axis", axis}, {"start", start}, {"end", end}, {"step", step}});
  };
  bad(OpKind::kSlice, slice(1, 2, 4, 1), EC::kInvalidArgument, {"slice", "end 4", "<= 3"});
  bad(OpKind::kSlice, slice(1, 2, 1, 1), EC::kInvalidArgument, {"slice", "start 2"});
  bad(OpKind::kSlice, slice(1, 0, 3, 0), EC::kInvalidArgument, {"slice", "step 0"});
  bad(OpKind::kSlice, slice(3, 0, 1, 1), EC::kInvalidArgument, {"slice", "axis 3 out of range"});
  bad(OpKind::kSlice, slice(-1, 0, 1, 1), EC::kInvalidArgument, {"slice", "axis -1"});
  const Attrs ax0 = attrs({{"axis", int64_t{0}}}), ax1 = attrs({{"axis", int64_t{1}}});
  bad(OpKind::kConcat, ax0, EC::kInvalidArgument, {"concat", "dtype"}, {x, TensorType(DType::kF16, {2, 3, 4})});
  bad(OpKind::kConcat, ax0, EC::kShapeMismatch, {"concat", "rank"}, {x, TensorType(DType::kF32, {2, 3})});
  bad(OpKind::kConcat, ax0, EC::kShapeMismatch, {"concat", "dim 2"}, {x, TensorType(DType::kF32, {2, 3, 5})});
  bad(OpKind::kSplit, attrs({{"axis", int64_t{2}}, {"sizes", Shape{1, 2}}}), EC::kShapeMismatch,
      {"split", "sum to 3", "is 4"});
  bad(OpKind::kSplit, attrs({{"axis", int64_t{2}}, {"sizes", Shape{5, -1}}}), EC::kInvalidArgument,
      {"split", "negative"});
  bad(OpKind::kPad, ints_attr("pads", {0, 0, 1, 1}), EC::kInvalidArgument, {"pad", "expected 6"});
  bad(OpKind::kPad, ints_attr("pads", {0, 0, -1, 1, 0, 0}), EC::kInvalidArgument, {"pad", ">= 0"});
  bad(OpKind::kPad, attrs({{"pads", Shape{0, 0, 3, 0, 0, 0}}, {"mode", std::string("reflect")}}), EC::kInvalidArgument,
      {"pad", "reflect", "< the dim (3)"});
  bad(OpKind::kPad, attrs({{"pads", Shape{0, 0, 0, 0, 0, 0}}, {"mode", std::string("wrap")}}), EC::kInvalidArgument,
      {"pad", "mode 'wrap'"});
  bad(OpKind::kPad, attrs({{"pads", Shape{0, 0, 1, 0, 0, 0}}, {"value", 300.0}}), EC::kInvalidArgument,
      {"pad", "value 300", "u8"}, {TensorType(DType::kU8, {2, 3, 4})});
  const TensorType fidx(DType::kF32, {2, 3, 4}), idx2(DType::kI64, {2, 3}), idx_big(DType::kI64, {3, 3, 4});
  bad(OpKind::kGather, ax1, EC::kInvalidArgument, {"gather", "i64 or i32"}, {x, fidx});
  bad(OpKind::kGather, ax1, EC::kShapeMismatch, {"gather", "rank"}, {x, idx2});
  bad(OpKind::kGather, ax1, EC::kShapeMismatch, {"gather", "dim 0"}, {x, idx_big});
  bad(OpKind::kIndexSelect, ax1, EC::kShapeMismatch, {"index_select", "1-D"}, {x, idx2});
  bad(OpKind::kIndexSelect, {}, EC::kInvalidArgument, {"index_select", "'axis'"}, {x, TensorType(DType::kI32, {2})});
  auto range = [&](double s, double e, double st) {
    return attrs({{"start", s}, {"end", e}, {"step", st}, {"dtype", DType::kF32}});
  };
  bad_generator(OpKind::kArange, range(0, 5, 0), {"arange", "step 0"});
  bad_generator(OpKind::kArange, range(0, 5, -1), {"arange", "wrong way"});
  bad_generator(OpKind::kArange, attrs({{"end", 4.0}}), {"arange", "'dtype'"});
  bad_generator(OpKind::kArange, attrs({{"end", 300.0}, {"dtype", DType::kI8}}), {"arange", "i8"});
  bad_generator(OpKind::kFull, attrs({{"shape", Shape{2, -3}}, {"value", 1.0}, {"dtype", DType::kF32}}),
                {"full", "negative extent -3"});
  bad_generator(OpKind::kFull, attrs({{"shape", Shape{2}}, {"value", -1.0}, {"dtype", DType::kU8}}),
                {"full", "value -1", "u8"});
  bad_generator(OpKind::kFull, attrs({{"shape", Shape{2}}, {"value", std::string("x")}, {"dtype", DType::kF32}}),
                {"full", "'value' must be a float"});
}

TEST(ShapeOps, OneKernelRunsFromSeveralThreadsAtOnce) {
  Graph g;
  Tensor x = random_tensor(DType::kF32, {64, 96, 70});
  g.add_node(OpKind::kPermute, {g.add_input("x", x.type)}, ints_attr("perm", {2, 0, 1}));
  auto k = build(g);
  const TensorType yt = g.type(g.nodes().back()->outputs[0]);
  std::vector<std::vector<Tensor>> outs(4);
  std::vector<std::thread> threads;
  for (auto& o : outs) {
    o.emplace_back(yt);
    threads.emplace_back([&] { run_kernel(*k, {&x}, o); });
  }
  for (auto& t : threads) t.join();
  for (auto& o : outs)
    expect_moved(o[0], x, [](const Shape& i) { return (i[1] * 96 + i[2]) * 70 + i[0]; }, 0, "concurrent permute");
}
