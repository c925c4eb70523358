// The explicit "can the CUDA backend run this node?" predicates of the shape, gather, generator
// and pointwise families, without a GPU: over the node cases of test_cuda_gen_codegen.cpp and
// test_cuda_pointwise_codegen.cpp plus nodes built to be refused (more dims than the kernels
// walk, a transpose grid too large, a constant index out of range, a fused body or pointer count
// the kernels cannot take, an op of another family), supports_<family> must say yes exactly when
// the generator succeeds, and when it says no its reason must be non-empty and be the reason the
// generator fails with.
#ifdef KILN_WITH_CUDA

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/codegen/pointwise_program.h"
#include "src/backends/cuda/kernels.h"
#include "tests/cpp/cuda_node_test_util.h"

using namespace kiln;
namespace gen = kiln::cuda::gen;
using namespace kiln::test;
namespace pwg = kiln::cuda::pwgen;

namespace {

std::string what_of(const Built& b) {
  std::string s = op_name(b.node->op);
  for (ValueId v : b.node->inputs) {
    s += ' ';
    s += b.g.type(v).to_string();
  }
  return s;
}

using Supports = bool (*)(const Node&, const Graph&, std::string*);

// supports(node) against `generate` (which throws what the generator throws): they agree, and a
// refusal's reason is non-empty and is the generator's error message. Returns the reason ("" when
// supported).
std::string agree(Supports supports, const std::function<void(const Node&, const Graph&)>& generate, const Built& b) {
  std::string why;
  const bool yes = supports(*b.node, b.g, &why);
  std::optional<std::string> error;
  try {
    generate(*b.node, b.g);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_EQ(yes, !error.has_value()) << what_of(b) << ": supports says " << (yes ? "yes" : "no: " + why)
                                     << ", generation " << error.value_or("succeeds");
  if (!yes) {
    EXPECT_FALSE(why.empty()) << what_of(b);
    if (error) {
      EXPECT_EQ(*error, why) << what_of(b);
    }
  }
  return yes ? "" : why;
}

std::string shape_case(const Built& b) {
  return agree(cuda::supports_shape, [](const Node& n, const Graph& g) { gen::generate_shape(n, g); }, b);
}
std::string gather_case(const Built& b) {
  return agree(cuda::supports_gather, [](const Node& n, const Graph& g) { gen::generate_gather(n, g); }, b);
}
std::string generator_case(const Built& b) {
  return agree(cuda::supports_generator, [](const Node& n, const Graph& g) { gen::generate_generator(n, g); }, b);
}

// Pointwise generation: the program, its layout and the source; a refusal throws its reason.
void generate_pointwise(const Node& n, const Graph& g) {
  std::string why;
  pwg::Program p;
  if (!pwg::program_of(n, g, &p, &why)) throw Error(ErrorCode::kUnsupported, why);
  bool ok = false;
  const pwg::Layout l = pwg::layout_of(n, g, p, &why, &ok);
  if (!ok) throw Error(ErrorCode::kUnsupported, why);
  EXPECT_FALSE(pwg::generate(p, l).empty());
}

// The pointwise predicate against program_of / layout_of / generate, and against
// make_pointwise_kernel, which fails before any device call with the predicate's reason.
std::string pointwise_case(const Built& b) {
  std::string why;
  const bool yes = cuda::supports_pointwise(*b.node, b.g, &why);
  bool generated = true;
  std::string error;
  const OpFamily fam = op_info(b.node->op).family;
  if (fam == OpFamily::kUnary || fam == OpFamily::kBinary || fam == OpFamily::kWhere || fam == OpFamily::kCast ||
      fam == OpFamily::kFused) {
    try {
      generate_pointwise(*b.node, b.g);
    } catch (const Error& e) {
      generated = false;
      error = e.what();
    }
  } else {
    generated = false;
  }
  EXPECT_EQ(yes, generated) << what_of(b) << ": " << why << " / " << error;
  if (yes) return "";
  EXPECT_FALSE(why.empty()) << what_of(b);
  if (!error.empty()) {
    EXPECT_EQ(error, "[unsupported] " + why) << what_of(b);
  }
  try {
    cuda::make_pointwise_kernel(*b.node, b.g, KernelOptions{}, nullptr);
    ADD_FAILURE() << what_of(b) << ": make_pointwise_kernel accepted a refused node";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_EQ(std::string(e.what()),
              "[unsupported] CUDA " + std::string(op_name(b.node->op)) + " node '" + b.node->name + "': " + why);
  }
  return why;
}

// A rank-`rank` shape of 2s whose permutation reverses the dims: no two neighbours merge.
Built reversed_permute(int rank) {
  Shape x, perm;
  for (int d = 0; d < rank; ++d) x.push_back(2 + d % 2), perm.push_back(rank - 1 - d);
  return one_node(OpKind::kPermute, {tt(DType::kF32, x)}, attrs({{"perm", perm}}));
}

}  // namespace

TEST(CudaFamilyPredicates, ShapeAcceptsWhatItGeneratesAndNamesWhatItRefuses) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kI64, DType::kBool, DType::kF64}) {
    EXPECT_EQ(shape_case(one_node(OpKind::kReshape, {tt(dt, {2, 3, 4})}, attrs({{"shape", Shape{6, 4}}}))), "");
    EXPECT_EQ(shape_case(one_node(OpKind::kCopy, {tt(dt, {3, 4})})), "");
    EXPECT_EQ(shape_case(one_node(OpKind::kPermute, {tt(dt, {2, 3, 4})}, attrs({{"perm", Shape{2, 0, 1}}}))), "");
    EXPECT_EQ(shape_case(one_node(OpKind::kPermute, {tt(dt, {2, 3, 4, 5})}, attrs({{"perm", Shape{0, 2, 3, 1}}}))), "");
    EXPECT_EQ(shape_case(one_node(OpKind::kPermute, {tt(dt, {2, 12, 64, 64})}, attrs({{"perm", Shape{0, 2, 1, 3}}}))),
              "");
    EXPECT_EQ(shape_case(one_node(OpKind::kExpand, {tt(dt, {3, 1, 4})}, attrs({{"shape", Shape{3, 5, 4}}}))), "");
    EXPECT_EQ(shape_case(one_node(OpKind::kExpand, {tt(dt, {1, 4})}, attrs({{"shape", Shape{3, 4}}}))), "");
    EXPECT_EQ(shape_case(one_node(
                  OpKind::kSlice, {tt(dt, {3, 7})},
                  attrs({{"axis", int64_t(1)}, {"start", int64_t(1)}, {"end", int64_t(6)}, {"step", int64_t(2)}}))),
              "");
    EXPECT_EQ(shape_case(one_node(OpKind::kConcat, {tt(dt, {2, 3}), tt(dt, {2, 5}), tt(dt, {2, 1})},
                                  attrs({{"axis", int64_t(1)}}))),
              "");
    EXPECT_EQ(shape_case(
                  one_node(OpKind::kSplit, {tt(dt, {3, 6})}, attrs({{"axis", int64_t(1)}, {"sizes", Shape{2, 3, 1}}}))),
              "");
    for (const char* mode : {"constant", "reflect", "replicate"})
      EXPECT_EQ(shape_case(one_node(
                    OpKind::kPad, {tt(dt, {1, 2, 5, 5})},
                    attrs({{"pads", Shape{0, 0, 0, 0, 2, 1, 1, 3}}, {"mode", std::string(mode)}, {"value", 0.5}}))),
                "");
  }
  EXPECT_EQ(
      shape_case(one_node(OpKind::kPermute, {tt(DType::kF16, {8, 64, 56, 56})}, attrs({{"perm", Shape{0, 2, 3, 1}}}))),
      "");
  EXPECT_EQ(shape_case(one_node(OpKind::kPad, {tt(DType::kF16, {32, 3, 224, 224})},
                                attrs({{"pads", Shape{0, 0, 0, 0, 0, 0, 0, 1}}, {"input_perm", Shape{0, 2, 3, 1}}}))),
            "");
  EXPECT_EQ(shape_case(one_node(OpKind::kPad, {tt(DType::kF16, {1100, 1024, 1024})},
                                attrs({{"pads", Shape{0, 0, 0, 0, 0, 1}}}))),
            "");
  EXPECT_EQ(shape_case(one_node(OpKind::kCopy, {tt(DType::kF32, {0, 8})})), "");

  // Eight dims that do not merge are the most the copy walks; nine are refused, in a permute and
  // in a concat's part, unless there is nothing to copy.
  EXPECT_EQ(shape_case(reversed_permute(8)), "");
  EXPECT_EQ(shape_case(reversed_permute(9)),
            "[unsupported] strided copy with 9 non-mergeable dims (the CUDA kernel takes 8)");
  Shape nine{2, 3, 2, 3, 2, 3, 2, 3, 2}, perm9{8, 7, 6, 5, 4, 3, 2, 1, 0};
  nine[4] = 0;
  EXPECT_EQ(shape_case(one_node(OpKind::kPermute, {tt(DType::kF32, nine)}, attrs({{"perm", perm9}}))), "");
  // Rank-9 parts of a concat merge into the dims before and from the axis.
  EXPECT_EQ(shape_case(one_node(OpKind::kConcat, {tt(DType::kF32, Shape(9, 2)), tt(DType::kF32, Shape(9, 2))},
                                attrs({{"axis", int64_t(4)}}))),
            "");
  // A transpose whose 32 x 32 tiles would not fit a grid.
  EXPECT_EQ(shape_case(one_node(OpKind::kPermute, {tt(DType::kF16, {int64_t(1) << 21, int64_t(1) << 21})},
                                attrs({{"perm", Shape{1, 0}}}))),
            "[unsupported] transpose of 2097152 x 2097152 is too large");
  EXPECT_EQ(shape_case(one_node(OpKind::kPermute, {tt(DType::kF16, {int64_t(1) << 20, int64_t(1) << 20})},
                                attrs({{"perm", Shape{1, 0}}}))),
            "");
  // pad walks at most eight padded dims; an empty output needs no walk.
  EXPECT_EQ(shape_case(one_node(OpKind::kPad, {tt(DType::kF32, Shape(8, 2))}, attrs({{"pads", Shape(16, 1)}}))), "");
  EXPECT_EQ(shape_case(one_node(OpKind::kPad, {tt(DType::kF32, Shape(9, 2))}, attrs({{"pads", Shape(18, 1)}}))),
            "[unsupported] pad: 9 padded or unmergeable dims exceed the CUDA kernel's 8");
  Shape empty9(9, 2), pads9(18, 1);
  empty9[0] = 0, pads9[0] = pads9[1] = 0;
  EXPECT_EQ(shape_case(one_node(OpKind::kPad, {tt(DType::kF32, empty9)}, attrs({{"pads", pads9}}))), "");
  // Another family's op.
  EXPECT_EQ(shape_case(one_node(OpKind::kRelu, {tt(DType::kF32, {3})})), "[internal] relu is not in the shape family");
}

TEST(CudaFamilyPredicates, GatherAcceptsWhatItGeneratesAndNamesWhatItRefuses) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kI64, DType::kBool})
    for (DType it : {DType::kI64, DType::kI32}) {
      EXPECT_EQ(gather_case(one_node(OpKind::kGather, {tt(dt, {3, 5}), tt(it, {3, 4})}, attrs({{"axis", int64_t(1)}}))),
                "");
      EXPECT_EQ(gather_case(one_node(OpKind::kGather, {tt(dt, {4, 3}), tt(it, {2, 3})}, attrs({{"axis", int64_t(0)}}))),
                "");
      EXPECT_EQ(
          gather_case(one_node(OpKind::kIndexSelect, {tt(dt, {5, 3}), tt(it, {4})}, attrs({{"axis", int64_t(0)}}))),
          "");
      EXPECT_EQ(
          gather_case(one_node(OpKind::kIndexSelect, {tt(dt, {2, 6, 3}), tt(it, {2})}, attrs({{"axis", int64_t(1)}}))),
          "");
    }
  EXPECT_EQ(gather_case(one_node(OpKind::kIndexSelect, {tt(DType::kF16, {30000, 768}), tt(DType::kI64, {128})},
                                 attrs({{"axis", int64_t(0)}}))),
            "");
  // gather walks at most 8 dims (none when its output is empty); index_select has no rank limit.
  EXPECT_EQ(gather_case(one_node(OpKind::kGather, {tt(DType::kF32, Shape(8, 2)), tt(DType::kI64, Shape(8, 2))},
                                 attrs({{"axis", int64_t(0)}}))),
            "");
  EXPECT_EQ(gather_case(one_node(OpKind::kGather, {tt(DType::kF32, Shape(9, 2)), tt(DType::kI64, Shape(9, 2))},
                                 attrs({{"axis", int64_t(3)}}))),
            "[unsupported] gather: rank 9 exceeds the CUDA kernel's 8");
  Shape empty9(9, 2);
  empty9[5] = 0;
  EXPECT_EQ(gather_case(one_node(OpKind::kGather, {tt(DType::kF32, Shape(9, 2)), tt(DType::kI64, empty9)},
                                 attrs({{"axis", int64_t(0)}}))),
            "");
  EXPECT_EQ(gather_case(one_node(OpKind::kIndexSelect, {tt(DType::kF32, Shape(9, 2)), tt(DType::kI32, {3})},
                                 attrs({{"axis", int64_t(8)}}))),
            "");
  // A constant index is checked at make time: out of range it is the CPU kernel's error; in range
  // (negative ones count from the end) it runs.
  for (OpKind op : {OpKind::kGather, OpKind::kIndexSelect})
    for (int64_t value : {int64_t(4), int64_t(-5), int64_t(5), int64_t(-6)}) {
      Built b;
      const ValueId x = b.g.add_input("x", tt(DType::kF32, {5, 3}));
      const int64_t idx[3] = {0, value, 2};
      const Shape is = op == OpKind::kGather ? Shape{3, 1} : Shape{3};
      const ValueId i = b.g.add_constant("idx", tt(DType::kI64, is), idx, sizeof idx);
      b.g.add_node(op, {x, i}, attrs({{"axis", int64_t(0)}}), "pick");
      b.node = b.g.nodes().back().get();
      const bool in_range = value >= -5 && value < 5;
      EXPECT_EQ(gather_case(b), in_range ? ""
                                         : "[invalid argument] " + std::string(op_name(op)) +
                                               " of x f32[5,3] ('pick'): index " + std::to_string(value) +
                                               " is out of range for axis 0 of size 5");
    }
  EXPECT_EQ(gather_case(one_node(OpKind::kRelu, {tt(DType::kF32, {3})})),
            "[internal] relu is not in the gather family");
}

TEST(CudaFamilyPredicates, GeneratorAcceptsWhatItGeneratesAndNamesWhatItRefuses) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64, DType::kI32, DType::kI8,
                   DType::kU8, DType::kBool}) {
    EXPECT_EQ(generator_case(
                  one_node(OpKind::kArange, {}, attrs({{"start", 0.0}, {"end", 10.0}, {"step", 1.0}, {"dtype", dt}}))),
              "");
    EXPECT_EQ(
        generator_case(one_node(OpKind::kFull, {}, attrs({{"shape", Shape{2, 3}}, {"value", 1.0}, {"dtype", dt}}))),
        "");
  }
  EXPECT_EQ(
      generator_case(one_node(OpKind::kArange, {}, attrs({{"start", 2.0}, {"end", 2.0}, {"dtype", DType::kF32}}))), "");
  EXPECT_EQ(generator_case(one_node(OpKind::kRelu, {tt(DType::kF32, {3})})),
            "[internal] relu is not in the generator family");
}

namespace {

// fused_pointwise over `count` inputs summed in order: [4, 8] each, the last `scalars` of them one
// element.
Built fused_sum(int count, int scalars) {
  auto body = std::make_shared<Graph>();
  std::vector<TensorType> types;
  std::vector<ValueId> in;
  for (int i = 0; i < count; ++i) {
    types.push_back(tt(DType::kF32, i >= count - scalars ? Shape{1} : Shape{4, 8}));
    in.push_back(body->add_input(input_name(size_t(i)), types.back()));
  }
  ValueId sum = in[0];
  for (int i = 1; i < count; ++i) sum = body->add_node1(OpKind::kAdd, {sum, in[size_t(i)]});
  body->mark_output(sum, "y");
  Built b;
  std::vector<ValueId> outer;
  for (int i = 0; i < count; ++i) outer.push_back(b.g.add_input(input_name(size_t(i)), types[size_t(i)]));
  b.g.mark_output(b.g.insert_fused(0, outer, body, "sum_t")[0], "y");
  b.node = b.g.nodes().back().get();
  return b;
}

// fused_pointwise y = x * c with c a constant of `n` elements (one: a kernel argument; more: refused).
Built fused_scale(int64_t n) {
  auto body = std::make_shared<Graph>();
  const TensorType xt = tt(DType::kF16, {4, 8});
  const ValueId x = body->add_input("x", xt);
  const std::vector<uint16_t> c(size_t(n), 0x3c00);  // f16 1.0
  const ValueId k = body->add_constant("c", tt(DType::kF16, n == 1 ? Shape{} : Shape{n}), c.data(), c.size() * 2);
  body->mark_output(body->add_node1(OpKind::kMul, {x, k}), "y");
  Built b;
  b.g.mark_output(b.g.insert_fused(0, {b.g.add_input("x", xt)}, body, "scale_t")[0], "y");
  b.node = b.g.nodes().back().get();
  return b;
}

}  // namespace

TEST(CudaFamilyPredicates, PointwiseAcceptsWhatItGeneratesAndNamesWhatItRefuses) {
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64,
                       DType::kI32, DType::kI8,  DType::kU8,   DType::kBool};
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64})
    for (OpKind op :
         {OpKind::kRelu, OpKind::kGelu, OpKind::kSilu, OpKind::kSigmoid, OpKind::kTanh, OpKind::kExp, OpKind::kLog,
          OpKind::kSqrt, OpKind::kRsqrt, OpKind::kNeg, OpKind::kAbs, OpKind::kErf, OpKind::kHardswish,
          OpKind::kHardsigmoid, OpKind::kReciprocal, OpKind::kSin, OpKind::kCos, OpKind::kClamp, OpKind::kLeakyRelu})
      EXPECT_EQ(pointwise_case(one_node(op, {tt(dt, {3, 40})},
                                        op == OpKind::kClamp ? attrs({{"min", -0.5}, {"max", 0.75}}) : Attrs{})),
                "");
  for (DType dt : {DType::kI64, DType::kI32, DType::kI8, DType::kU8})
    for (OpKind op : {OpKind::kRelu, OpKind::kNeg, OpKind::kAbs, OpKind::kClamp})
      EXPECT_EQ(pointwise_case(one_node(op, {tt(dt, {7, 9})}, op == OpKind::kClamp ? attrs({{"min", -2.5}}) : Attrs{})),
                "");
  EXPECT_EQ(pointwise_case(one_node(OpKind::kLogicalNot, {tt(DType::kBool, {5, 64})})), "");
  for (DType dt : all) {
    for (OpKind op : {OpKind::kEq, OpKind::kNe, OpKind::kLt, OpKind::kLe, OpKind::kGt, OpKind::kGe})
      EXPECT_EQ(pointwise_case(one_node(op, {tt(dt, {4, 33}), tt(dt, {33})})), "");
    if (dt != DType::kBool) {
      for (OpKind op : {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kDiv, OpKind::kMaximum, OpKind::kMinimum})
        EXPECT_EQ(pointwise_case(one_node(op, {tt(dt, {4, 33}), tt(dt, {1})})), "");
    }
    EXPECT_EQ(pointwise_case(one_node(OpKind::kWhere, {tt(DType::kBool, {33}), tt(dt, {4, 33}), tt(dt, {4, 33})})), "");
    for (DType to : all)
      EXPECT_EQ(pointwise_case(one_node(OpKind::kCast, {tt(dt, {2, 50})}, attrs({{"dtype", to}}))), "");
  }
  EXPECT_EQ(pointwise_case(one_node(OpKind::kPow, {tt(DType::kF16, {4, 33}), tt(DType::kF16, {4, 33})})), "");
  EXPECT_EQ(pointwise_case(one_node(OpKind::kLogicalAnd, {tt(DType::kBool, {4, 33}), tt(DType::kBool, {4, 33})})), "");
  EXPECT_EQ(pointwise_case(one_node(OpKind::kAdd, {tt(DType::kF16, {3, 1 << 29}), tt(DType::kF16, {1 << 29})})), "");

  // Broadcasts that collapse to at most 8 dims run; more are refused.
  auto alternating = [](int rank) {
    Shape a, b;
    for (int d = 0; d < rank; ++d) a.push_back(d % 2 ? 1 : 2), b.push_back(d % 2 ? 2 : 1);
    return one_node(OpKind::kAdd, {tt(DType::kF32, a), tt(DType::kF32, b)});
  };
  EXPECT_EQ(pointwise_case(alternating(8)), "");
  EXPECT_EQ(pointwise_case(alternating(10)), "pointwise broadcast over 10 non-mergeable dims (at most 8)");
  // Fused bodies: one-element constants are arguments, larger ones refused; at most 16 non-scalar
  // inputs and 48 pointers.
  EXPECT_EQ(pointwise_case(fused_scale(1)), "");
  EXPECT_EQ(pointwise_case(fused_scale(8)),
            "fused_pointwise body holds a constant of 8 elements (the CUDA generator takes one-element constants; "
            "larger ones are inputs)");
  EXPECT_EQ(pointwise_case(fused_sum(16, 0)), "");
  EXPECT_EQ(pointwise_case(fused_sum(20, 4)), "");
  EXPECT_EQ(pointwise_case(fused_sum(17, 0)), "pointwise node with 17 non-scalar inputs (at most 16)");
  EXPECT_EQ(pointwise_case(fused_sum(47, 40)), "");
  EXPECT_EQ(pointwise_case(fused_sum(48, 40)),
            "pointwise node with 49 inputs and outputs (the CUDA kernel takes at most 48)");
  // Another family's op.
  EXPECT_EQ(pointwise_case(one_node(OpKind::kMatmul, {tt(DType::kF32, {2, 3}), tt(DType::kF32, {3, 4})})),
            "matmul is not a pointwise op");
}

#endif  // KILN_WITH_CUDA
