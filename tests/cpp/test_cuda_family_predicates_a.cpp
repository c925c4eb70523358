// The explicit "can the generator serve this node?" predicates of the reduce, softmax, norm and
// pool families (gen::why_not_<family>, answered by supports_<family>): over the node cases of
// test_cuda_gen_codegen.cpp for these families and over nodes the generators cannot serve
// (a wrong dtype or rank, a missing or mistyped attribute, a limit passed), supports_<family> is
// true exactly when generate_<family> succeeds, and when it is false its reason is the one the
// generator fails with. No GPU is needed: nothing is compiled.
#ifdef KILN_WITH_CUDA

#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <tuple>

#include "kiln/kiln.h"
#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/kernels.h"
#include "tests/cpp/cuda_node_test_util.h"

using namespace kiln;
namespace gen = kiln::cuda::gen;
using namespace kiln::test;

namespace {

// Nodes the shape rules would refuse, made by changing a valid node after the fact: the
// predicates must still answer (not throw) and agree with the generators.
Built with_x_type(Built b, const TensorType& t) {
  b.g.value(b.node->inputs[0]).type = t;
  return b;
}
Built with_attr(Built b, const std::string& key, AttrValue v) {
  b.node->attrs.set(key, std::move(v));
  return b;
}
Built without_attr(Built b, const std::string& key) {
  b.node->attrs.erase(key);
  return b;
}

const DType kFloats[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64};

struct Family {
  bool (*supports)(const Node&, const Graph&, std::string*);
  gen::Generated (*generate)(const Node&, const Graph&);
};
const Family kReduce{cuda::supports_reduce, gen::generate_reduce};
const Family kSoftmax{cuda::supports_softmax, gen::generate_softmax};
const Family kNorm{cuda::supports_norm, gen::generate_norm};
const Family kPool{cuda::supports_pool, gen::generate_pool};

// Checks that supports and generate agree on b; returns the reason ("" when supported).
std::string agree(const Family& f, const Built& b) {
  const std::string what = std::string(op_name(b.node->op)) + " " + b.g.type(b.node->inputs[0]).to_string();
  std::string why;
  const bool ok = f.supports(*b.node, b.g, &why);
  std::optional<std::string> error;
  try {
    f.generate(*b.node, b.g);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_EQ(ok, !error.has_value()) << what << ": supports says " << ok << (error ? ", generate: " + *error : "");
  if (ok) {
    EXPECT_TRUE(why.empty()) << what << ": " << why;
    return "";
  }
  EXPECT_FALSE(why.empty()) << what;
  if (error) {
    EXPECT_EQ(*error, "[unsupported] " + why) << what;
  }
  return why;
}

void expect_supported(const Family& f, const Built& b) { EXPECT_EQ(agree(f, b), "") << op_name(b.node->op); }
void expect_refused(const Family& f, const Built& b, const std::string& reason) {
  EXPECT_EQ(agree(f, b), reason) << op_name(b.node->op);
}

}  // namespace

TEST(CudaFamilyPredicate, Reduce) {
  const OpKind ops[] = {OpKind::kReduceSum, OpKind::kReduceMean, OpKind::kReduceMax, OpKind::kReduceMin,
                        OpKind::kReduceVar};
  const std::vector<std::vector<int64_t>> axes = {{1}, {0, 2}, {}, {2}, {0, 1, 2}};
  for (DType dt : kFloats)
    for (OpKind op : ops)
      for (const auto& ax : axes) {
        Attrs a = attrs({{"axes", ax}, {"keepdim", false}});
        if (op == OpKind::kReduceVar) a.set("correction", 1.0);
        expect_supported(kReduce, one_node(op, {tt(dt, {3, 4, 5})}, a));
      }
  for (DType dt : {DType::kI64, DType::kI32, DType::kI8, DType::kU8})
    for (OpKind op : {OpKind::kReduceSum, OpKind::kReduceMax, OpKind::kReduceMin})
      expect_supported(kReduce, one_node(op, {tt(dt, {4, 6})}, attrs({{"axes", Shape{1}}})));
  expect_supported(kReduce, one_node(OpKind::kReduceMax, {tt(DType::kBool, {4, 6, 16})}, attrs({{"axes", Shape{1}}})));
  expect_supported(kReduce, one_node(OpKind::kReduceMean, {tt(DType::kF16, {8, 4096})}, attrs({{"axes", Shape{1}}})));
  expect_supported(kReduce, one_node(OpKind::kReduceSum, {tt(DType::kF32, {64, 3, 100})}, attrs({{"axes", Shape{0}}})));
  expect_supported(kReduce, one_node(OpKind::kReduceMean, {tt(DType::kF32, {3, 0})}, attrs({{"axes", Shape{1}}})));
  for (DType dt : {DType::kF32, DType::kF16, DType::kI64, DType::kBool})
    for (int64_t axis : {0, 1, 2})
      expect_supported(kReduce,
                       one_node(OpKind::kArgmax, {tt(dt, {3, 5, 7})}, attrs({{"axis", axis}, {"keepdim", true}})));

  // Four kept and four reduced dims outside the innermost run fit the kernels' Side; five do not,
  // unless there is nothing to reduce (a fill) or nothing to write.
  const Shape alternating = {2, 3, 2, 3, 2, 3, 2, 3, 2, 3};
  expect_supported(kReduce, one_node(OpKind::kReduceSum, {tt(DType::kF32, {2, 3, 4, 5, 6, 7, 8, 9})},
                                     attrs({{"axes", Shape{0, 2, 4, 6}}})));
  expect_refused(kReduce,
                 one_node(OpKind::kReduceSum, {tt(DType::kF32, alternating)}, attrs({{"axes", Shape{0, 2, 4, 6, 8}}})),
                 "reduce_sum: more than 4 alternating reduced and kept dims");
  expect_refused(kReduce,
                 one_node(OpKind::kReduceMax, {tt(DType::kF16, alternating)}, attrs({{"axes", Shape{1, 3, 5, 7, 9}}})),
                 "reduce_max: more than 4 alternating reduced and kept dims");
  expect_supported(kReduce, one_node(OpKind::kReduceSum, {tt(DType::kF32, {2, 3, 2, 3, 2, 3, 2, 3, 0, 3})},
                                     attrs({{"axes", Shape{0, 2, 4, 6, 8}}})));
  expect_supported(kReduce, one_node(OpKind::kReduceSum, {tt(DType::kF32, {2, 3, 2, 3, 2, 3, 2, 3, 2, 0})},
                                     attrs({{"axes", Shape{0, 2, 4, 6, 8}}})));

  const Built var = one_node(OpKind::kReduceVar, {tt(DType::kF32, {3, 4})}, attrs({{"axes", Shape{1}}}));
  expect_refused(kReduce, with_x_type(var, tt(DType::kI32, {3, 4})), "reduce_var of i32[3,4]");
  expect_refused(kReduce, with_x_type(var, tt(DType::kI32, {3, 0})), "reduce_var of i32[3,0]");
  expect_refused(kReduce, with_attr(var, "correction", std::string("1")),
                 "reduce_var: attribute 'correction' is not of type float");
  expect_supported(kReduce, with_attr(var, "correction", int64_t(0)));  // an int reads as a float
  expect_refused(kReduce, with_attr(var, "axes", std::string("1")),
                 "reduce_var: attribute 'axes' is not of type int list");
  expect_refused(kReduce, with_attr(var, "axes", Shape{2}), "reduce_var: axis 2 out of range for f32[3,4]");
  const Built argmax = one_node(OpKind::kArgmax, {tt(DType::kF32, {3, 4})}, attrs({{"axis", int64_t(1)}}));
  expect_refused(kReduce, without_attr(argmax, "axis"), "argmax: missing attribute 'axis'");
  expect_refused(kReduce, with_attr(argmax, "axis", int64_t(-1)), "argmax: axis -1 out of range for f32[3,4]");
  expect_supported(kReduce, with_attr(argmax, "axis", true));  // a bool reads as an int
  expect_refused(kReduce, one_node(OpKind::kSoftmax, {tt(DType::kF32, {3, 4})}, attrs({{"axis", int64_t(1)}})),
                 "softmax is not in the reduce family");
}

TEST(CudaFamilyPredicate, Softmax) {
  for (DType dt : kFloats)
    for (OpKind op : {OpKind::kSoftmax, OpKind::kLogSoftmax})
      for (const auto& [shape, axis] : std::vector<std::pair<Shape, int64_t>>{{{2, 5, 7}, 2},
                                                                              {{2, 5, 7}, 1},
                                                                              {{4, 3}, 0},
                                                                              {{3, 130}, 1},
                                                                              {{4, 1000}, 1},
                                                                              {{2, 4096}, 1},
                                                                              {{2, 50000}, 1},
                                                                              {{8, 128}, 1},
                                                                              {{3, 0}, 1}})
        expect_supported(kSoftmax, one_node(op, {tt(dt, shape)}, attrs({{"axis", axis}})));
  const Built b = one_node(OpKind::kSoftmax, {tt(DType::kF32, {3, 4})}, attrs({{"axis", int64_t(1)}}));
  for (DType dt : {DType::kI64, DType::kI32, DType::kBool})
    expect_refused(kSoftmax, with_x_type(b, tt(dt, {3, 4})),
                   std::string("softmax: x must be floating, got ") + dtype_name(dt) + "[3,4]");
  expect_refused(kSoftmax, without_attr(b, "axis"), "softmax: missing attribute 'axis'");
  expect_refused(kSoftmax, with_attr(b, "axis", 1.0), "softmax: attribute 'axis' is not of type int");
  expect_refused(kSoftmax, with_attr(b, "axis", int64_t(2)), "softmax: axis 2 out of range for f32[3,4]");
  expect_supported(kSoftmax, with_attr(b, "axis", true));
  Built absent = b;
  absent.node->inputs[0] = kNoValue;
  std::string why;
  EXPECT_FALSE(cuda::supports_softmax(*absent.node, absent.g, &why));
  EXPECT_EQ(why, "softmax: x is absent");
}

TEST(CudaFamilyPredicate, Norm) {
  for (DType dt : kFloats) {
    const std::vector<DType> pdts = dt == DType::kF16 ? std::vector<DType>{dt, DType::kF32} : std::vector<DType>{dt};
    for (DType pd : pdts) {
      for (const auto& [shape, k] : std::vector<std::pair<Shape, int64_t>>{
               {{2, 5, 8}, 1}, {{3, 4, 6}, 2}, {{4, 10}, 1}, {{2, 768}, 1}, {{2, 4096}, 1}, {{2, 40000}, 1}}) {
        const Shape ps(shape.end() - k, shape.end());
        Attrs a = attrs({{"normalized_rank", k}, {"eps", 1e-5}});
        expect_supported(kNorm, one_node(OpKind::kLayerNorm, {tt(dt, shape), tt(pd, ps), tt(pd, ps)}, a));
        expect_supported(kNorm, one_node(OpKind::kLayerNorm, {tt(dt, shape), std::nullopt, std::nullopt}, a));
        expect_supported(kNorm, one_node(OpKind::kLayerNorm, {tt(dt, shape), tt(pd, ps), std::nullopt}, a));
      }
      expect_supported(kNorm, one_node(OpKind::kGroupNorm, {tt(dt, {2, 6, 3, 3}), tt(pd, {6}), tt(pd, {6})},
                                       attrs({{"groups", int64_t(2)}, {"eps", 1e-5}})));
      expect_supported(kNorm, one_node(OpKind::kGroupNorm, {tt(dt, {3, 4, 5}), std::nullopt, std::nullopt},
                                       attrs({{"groups", int64_t(4)}, {"eps", 1e-5}})));
      for (const Shape& s : std::vector<Shape>{{2, 3, 4, 5}, {4, 3}, {2, 3, 7}}) {
        expect_supported(kNorm,
                         one_node(OpKind::kBatchNorm, {tt(dt, s), tt(pd, {3}), tt(pd, {3}), tt(pd, {3}), tt(pd, {3})},
                                  attrs({{"eps", 1e-5}})));
        expect_supported(kNorm,
                         one_node(OpKind::kBatchNorm, {tt(dt, s), tt(pd, {3}), tt(pd, {3})}, attrs({{"eps", 1e-3}})));
      }
    }
  }
  const Built ln = one_node(OpKind::kLayerNorm, {tt(DType::kF32, {3, 4})}, attrs({{"normalized_rank", int64_t(1)}}));
  expect_refused(kNorm, with_x_type(ln, tt(DType::kI32, {3, 4})), "layer_norm: x must be floating, got i32[3,4]");
  expect_refused(kNorm, with_attr(ln, "eps", std::string("small")), "layer_norm: attribute 'eps' is not of type float");
  expect_refused(kNorm, with_attr(ln, "normalized_rank", 1.0),
                 "layer_norm: attribute 'normalized_rank' is not of type int");
  expect_supported(kNorm, with_attr(ln, "eps", int64_t(0)));
  const Built bn =
      one_node(OpKind::kBatchNorm, {tt(DType::kF32, {3, 4}), tt(DType::kF32, {4}), tt(DType::kF32, {4})}, {});
  expect_refused(kNorm, with_x_type(bn, tt(DType::kBool, {3, 4})), "batch_norm: x must be floating, got bool[3,4]");
  expect_refused(kNorm, with_x_type(bn, tt(DType::kF32, {4})), "batch_norm: x must be [N, C, ...], got f32[4]");
  expect_refused(kNorm, with_attr(bn, "eps", true), "batch_norm: attribute 'eps' is not of type float");
  const Built gn = one_node(OpKind::kGroupNorm, {tt(DType::kF32, {2, 4, 3})}, attrs({{"groups", int64_t(2)}}));
  expect_refused(kNorm, without_attr(gn, "groups"), "group_norm: missing attribute 'groups'");
  expect_refused(kNorm, with_attr(gn, "groups", std::string("2")), "group_norm: attribute 'groups' is not of type int");
  expect_refused(kNorm, with_attr(gn, "groups", int64_t(0)), "group_norm: groups must not be 0");
  // An empty x launches nothing, whatever the group count says.
  expect_supported(kNorm, without_attr(with_x_type(gn, tt(DType::kF32, {0, 4, 3})), "groups"));
  expect_refused(kNorm, one_node(OpKind::kSoftmax, {tt(DType::kF32, {3, 4})}, attrs({{"axis", int64_t(1)}})),
                 "softmax is not in the norm family");
}

TEST(CudaFamilyPredicate, Pool) {
  for (DType dt : kFloats) {
    for (const auto& [shape, k, s, p, d, ceil] : std::vector<std::tuple<Shape, Shape, Shape, Shape, Shape, bool>>{
             {{2, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0}, {1, 1}, false},
             {{1, 2, 9, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
             {{1, 2, 8, 8}, {3, 3}, {2, 2}, {0, 0}, {1, 1}, true},
             {{1, 2, 9, 9}, {2, 3}, {1, 2}, {1, 1}, {2, 1}, false},
             {{2, 3, 11}, {3}, {2}, {1}, {1}, false}}) {
      expect_supported(
          kPool, one_node(OpKind::kMaxPool, {tt(dt, shape)},
                          attrs({{"kernel", k}, {"stride", s}, {"padding", p}, {"dilation", d}, {"ceil_mode", ceil}})));
      expect_supported(kPool, one_node(OpKind::kAvgPool, {tt(dt, shape)},
                                       attrs({{"kernel", k},
                                              {"stride", s},
                                              {"padding", p},
                                              {"ceil_mode", ceil},
                                              {"count_include_pad", false},
                                              {"divisor", int64_t(0)}})));
    }
    expect_supported(kPool,
                     one_node(OpKind::kAdaptiveAvgPool, {tt(dt, {2, 3, 8, 8})}, attrs({{"output_size", Shape{1, 1}}})));
    expect_supported(kPool,
                     one_node(OpKind::kAdaptiveAvgPool, {tt(dt, {1, 2, 7, 5})}, attrs({{"output_size", Shape{3, 2}}})));
    expect_supported(kPool,
                     one_node(OpKind::kAdaptiveAvgPool, {tt(dt, {2, 3, 10})}, attrs({{"output_size", Shape{4}}})));
    expect_supported(
        kPool, one_node(OpKind::kMaxPool, {tt(dt, {2, 8, 8, 16})},
                        attrs({{"kernel", Shape{3, 3}}, {"stride", Shape{2, 2}}, {"layout", std::string("nhwc")}})));
  }
  const Built mp = one_node(OpKind::kMaxPool, {tt(DType::kF32, {1, 3, 8, 8})}, attrs({{"kernel", Shape{2, 2}}}));
  expect_refused(kPool, with_x_type(mp, tt(DType::kI32, {1, 3, 8, 8})),
                 "max_pool: x must be floating, got i32[1,3,8,8]");
  expect_refused(kPool, with_x_type(mp, tt(DType::kF32, {1, 1, 3, 8, 8})),
                 "max_pool: x must be [N, C, W] or [N, C, H, W]");
  expect_refused(kPool, without_attr(mp, "kernel"), "max_pool: missing attribute 'kernel'");
  expect_refused(kPool, with_attr(mp, "kernel", int64_t(2)), "max_pool: attribute 'kernel' is not of type int list");
  expect_refused(kPool, with_attr(mp, "kernel", Shape{}), "max_pool: attribute 'kernel' must not be empty");
  expect_refused(kPool, with_attr(mp, "padding", Shape{}), "max_pool: attribute 'padding' must not be empty");
  expect_refused(kPool, with_attr(mp, "dilation", 1.0), "max_pool: attribute 'dilation' is not of type int list");
  expect_supported(kPool, with_attr(mp, "stride", Shape{}));  // an empty stride is the kernel
  expect_refused(kPool, with_attr(mp, "layout", int64_t(1)), "max_pool: attribute 'layout' must be a string");
  expect_refused(kPool, with_attr(mp, "layout", std::string("chw")),
                 "max_pool: attribute 'layout' must be \"nchw\" or \"nhwc\", got \"chw\"");
  expect_supported(kPool, with_attr(mp, "layout", std::string("nchw")));
  const Built ap = one_node(OpKind::kAvgPool, {tt(DType::kF32, {1, 3, 8, 8})}, attrs({{"kernel", Shape{2, 2}}}));
  expect_refused(kPool, with_attr(ap, "count_include_pad", int64_t(1)),
                 "avg_pool: attribute 'count_include_pad' is not of type bool");
  expect_refused(kPool, with_attr(ap, "divisor", 2.0), "avg_pool: attribute 'divisor' is not of type int");
  expect_supported(kPool, with_attr(ap, "divisor", true));
  const Built ad =
      one_node(OpKind::kAdaptiveAvgPool, {tt(DType::kF32, {1, 3, 8, 8})}, attrs({{"output_size", Shape{2, 2}}}));
  expect_refused(kPool, with_attr(ad, "layout", std::string("nhwc")),
                 "adaptive_avg_pool: layout \"nhwc\" applies to max_pool and avg_pool");
  expect_refused(kPool, one_node(OpKind::kSoftmax, {tt(DType::kF32, {1, 3, 8})}, attrs({{"axis", int64_t(1)}})),
                 "softmax is not in the pool family");
}

#endif  // KILN_WITH_CUDA
