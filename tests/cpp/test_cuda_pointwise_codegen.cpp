// The CUDA pointwise generator (unary, binary, where, cast, fused_pointwise) without a GPU:
// for every op of those families on every dtype the CPU backend accepts, and for flat,
// scalar-broadcast, strided and 64-bit-index layouts and fused bodies with constants and
// several outputs, the generated source must compile with NVRTC for sm_90. Also checked: the
// layout decisions that matter for speed (flat + 16-byte vectors, collapsed broadcast dims),
// that nodes differing only in sizes share one source (so they compile once), the limits
// that are refused with a reason, and that a damaged kernel state is refused as kCorrupted.
// Running the kernels against the CPU backend is tests/python/test_cuda_ops.py (needs a GPU).
#ifdef KILN_WITH_CUDA

#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/passes.h"
#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/codegen/pointwise_program.h"
#include "src/backends/cuda/kernels.h"
#include "src/ops/shape_rules.h"

using namespace kiln;
namespace pwg = kiln::cuda::pwgen;

namespace {

using Shape = std::vector<int64_t>;

struct Built {
  Graph g;
  const Node* node = nullptr;
};

Built one_node(OpKind op, const std::vector<TensorType>& ins, const Attrs& attrs = {}) {
  Built b;
  std::vector<ValueId> ids;
  for (size_t i = 0; i < ins.size(); ++i) {
    std::string name = "x";
    name += std::to_string(i);
    ids.push_back(b.g.add_input(name, ins[i]));
  }
  b.g.add_node(op, ids, attrs, std::string(op_name(op)) + "_t");
  b.node = b.g.nodes().back().get();
  return b;
}

struct Generated {
  pwg::Program program;
  pwg::Layout layout;
  std::string source;
};

Generated generate(const Built& b) {
  Generated out;
  std::string why;
  EXPECT_TRUE(cuda::supports_pointwise(*b.node, b.g, &why)) << why;
  EXPECT_TRUE(pwg::program_of(*b.node, b.g, &out.program, &why)) << why;
  bool ok = false;
  out.layout = pwg::layout_of(*b.node, b.g, out.program, &why, &ok);
  EXPECT_TRUE(ok) << why;
  out.source = pwg::generate(out.program, out.layout);
  return out;
}

// Generates and compiles the node's kernel; returns what was generated.
Generated compiles(const Built& b, const std::string& what) {
  Generated gen = generate(b);
  EXPECT_NO_THROW({
    const Bytes cubin = cuda::compile_to_cubin(gen.source, what, 90);
    EXPECT_GT(cubin.size(), 0u) << what;
  }) << what << "\n" << gen.source;
  EXPECT_NE(gen.source.find("void __launch_bounds__(256) kiln_pw("), std::string::npos) << what;
  if (gen.layout.vec > 1) {
    EXPECT_NE(gen.source.find("kiln_pw_vec("), std::string::npos) << what;
  }
  return gen;
}

const DType kFloats[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64};
const DType kInts[] = {DType::kI64, DType::kI32, DType::kI8, DType::kU8};
const DType kAll[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64,
                      DType::kI32, DType::kI8, DType::kU8, DType::kBool};

// Input shapes of a binary / where node, rotating over the three layouts.
std::vector<Shape> shapes_for(int variant, size_t n) {
  switch (variant % 3) {
    case 0: return std::vector<Shape>(n, Shape{4, 33});  // flat
    case 1: {                                             // a [33] bias broadcast over rows
      std::vector<Shape> s(n, Shape{4, 33});
      s.back() = {33};
      return s;
    }
    default: {  // a one-element operand
      std::vector<Shape> s(n, Shape{4, 33});
      s.back() = {1};
      return s;
    }
  }
}

TEST(CudaPointwiseCodegen, EveryUnaryOpAndDtypeCompiles) {
  const OpKind float_ops[] = {OpKind::kRelu, OpKind::kGelu, OpKind::kSilu, OpKind::kSigmoid, OpKind::kTanh,
                              OpKind::kExp, OpKind::kLog, OpKind::kSqrt, OpKind::kRsqrt, OpKind::kNeg,
                              OpKind::kAbs, OpKind::kErf, OpKind::kHardswish, OpKind::kHardsigmoid,
                              OpKind::kReciprocal, OpKind::kSin, OpKind::kCos, OpKind::kClamp, OpKind::kLeakyRelu};
  int count = 0;
  for (DType dt : kFloats) {
    for (OpKind op : float_ops) {
      Attrs a;
      if (op == OpKind::kClamp) a.set("min", -0.5), a.set("max", 0.75);
      if (op == OpKind::kLeakyRelu) a.set("negative_slope", 0.2);
      compiles(one_node(op, {TensorType(dt, {3, 40})}, a), std::string(op_name(op)) + " " + dtype_name(dt));
      ++count;
    }
    Attrs tanh_form;
    tanh_form.set("approximate", std::string("tanh"));
    compiles(one_node(OpKind::kGelu, {TensorType(dt, {3, 40})}, tanh_form), "gelu tanh");
    Attrs lower_only;
    lower_only.set("min", 0.0);
    compiles(one_node(OpKind::kClamp, {TensorType(dt, {3, 40})}, lower_only), "clamp min only");
    count += 2;
  }
  for (DType dt : kInts) {
    for (OpKind op : {OpKind::kRelu, OpKind::kNeg, OpKind::kAbs, OpKind::kClamp}) {
      Attrs a;
      if (op == OpKind::kClamp) a.set("min", -2.5), a.set("max", 1e30);
      compiles(one_node(op, {TensorType(dt, {7, 9})}, a), std::string(op_name(op)) + " " + dtype_name(dt));
      ++count;
    }
  }
  compiles(one_node(OpKind::kLogicalNot, {TensorType(DType::kBool, {5, 64})}), "logical_not bool");
  EXPECT_EQ(count + 1, 4 * 21 + 16 + 1);
}

TEST(CudaPointwiseCodegen, EveryBinaryOpAndDtypeCompiles) {
  const OpKind arith[] = {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kDiv, OpKind::kMaximum, OpKind::kMinimum};
  const OpKind compare[] = {OpKind::kEq, OpKind::kNe, OpKind::kLt, OpKind::kLe, OpKind::kGt, OpKind::kGe};
  int variant = 0;
  auto run = [&](OpKind op, DType dt) {
    const auto s = shapes_for(variant++, 2);
    const Generated gen = compiles(one_node(op, {TensorType(dt, s[0]), TensorType(dt, s[1])}),
                                   std::string(op_name(op)) + " " + dtype_name(dt) + " variant " +
                                       std::to_string(variant % 3));
    EXPECT_EQ(gen.layout.flat, (variant - 1) % 3 != 1);
  };
  for (DType dt : kAll) {
    if (dt != DType::kBool)
      for (OpKind op : arith) run(op, dt);
    for (OpKind op : compare) run(op, dt);
  }
  for (DType dt : kFloats) run(OpKind::kPow, dt);
  run(OpKind::kLogicalAnd, DType::kBool);
  run(OpKind::kLogicalOr, DType::kBool);
  EXPECT_EQ(variant, 8 * 6 + 9 * 6 + 4 + 2);
}

TEST(CudaPointwiseCodegen, WhereAndEveryCastCompile) {
  int variant = 0;
  for (DType dt : kAll) {
    const auto s = shapes_for(variant++, 3);
    compiles(one_node(OpKind::kWhere, {TensorType(DType::kBool, s[2]), TensorType(dt, s[0]), TensorType(dt, s[1])}),
             std::string("where ") + dtype_name(dt));
  }
  for (DType from : kAll) {
    for (DType to : kAll) {
      Attrs a;
      a.set("dtype", to);
      compiles(one_node(OpKind::kCast, {TensorType(from, {2, 50})}, a),
               std::string("cast ") + dtype_name(from) + " -> " + dtype_name(to));
    }
  }
}

// A fused node: body inputs x (f16 [4,8]), b (f32 [8], broadcast over rows), i (i32 [4,8]);
// constants 0.5 (f32) and 3 (i32); outputs y = gelu(cast(x, f32) * 0.5 + b) (f32) and
// z = where(i > 3, neg(x), x) (f16). Every body op gives the group shape, as the fusion pass
// guarantees.
Built fused_example(bool with_big_constant) {
  auto body = std::make_shared<Graph>();
  const TensorType xt(DType::kF16, {4, 8}), bt(DType::kF32, {8}), it(DType::kI32, {4, 8});
  const ValueId x = body->add_input("x", xt), b = body->add_input("b", bt), i = body->add_input("i", it);
  const float half = 0.5f;
  const int32_t three = 3;
  const ValueId c_half = body->add_constant("c_half", TensorType(DType::kF32, {}), &half, sizeof half);
  const ValueId c_three = body->add_constant("c_three", TensorType(DType::kI32, {}), &three, sizeof three);
  Attrs to_f32;
  to_f32.set("dtype", DType::kF32);
  const ValueId xf = body->add_node1(OpKind::kCast, {x}, to_f32);
  ValueId scaled = body->add_node1(OpKind::kMul, {xf, c_half});
  if (with_big_constant) {
    const std::vector<float> row(8, 1.5f);
    const ValueId big = body->add_constant("row", TensorType(DType::kF32, {8}), row.data(), row.size() * 4);
    scaled = body->add_node1(OpKind::kMul, {scaled, big});
  }
  const ValueId y = body->add_node1(OpKind::kGelu, {body->add_node1(OpKind::kAdd, {scaled, b})});
  const ValueId gt = body->add_node1(OpKind::kGt, {i, c_three});
  const ValueId z = body->add_node1(OpKind::kWhere, {gt, body->add_node1(OpKind::kNeg, {x}), x});
  body->mark_output(y, "y");
  body->mark_output(z, "z");
  Built out;
  const std::vector<ValueId> ins{out.g.add_input("x", xt), out.g.add_input("b", bt), out.g.add_input("i", it)};
  const auto outs = out.g.insert_fused(0, ins, body, "fused_t");
  out.g.mark_output(outs[0], "y");
  out.g.mark_output(outs[1], "z");
  out.node = out.g.nodes().back().get();
  return out;
}

TEST(CudaPointwiseCodegen, FusedBodyWithConstantsAndTwoOutputsCompiles) {
  const Generated gen = compiles(fused_example(false), "fused example");
  EXPECT_EQ(gen.program.steps.size(), 7u);
  EXPECT_EQ(gen.program.const_float.size(), 1u);
  EXPECT_EQ(gen.program.const_int.size(), 1u);
  EXPECT_EQ(gen.program.outputs.size(), 2u);
  EXPECT_FALSE(gen.layout.flat);  // b broadcasts over rows
  EXPECT_EQ(gen.layout.rank, 2);
  // The constants are kernel arguments, not part of the source.
  EXPECT_EQ(gen.source.find("0x1p-1"), std::string::npos);
  const std::vector<int64_t> args = pwg::argument_block(gen.program, gen.layout);
  // n, 2 dims, 3 inputs x 2 strides, 1 float constant, 1 int constant.
  ASSERT_EQ(args.size(), 1u + 2 + 6 + 1 + 1);
  EXPECT_EQ(args[0], 32);
  EXPECT_EQ(args.back(), 3);
}

TEST(CudaPointwiseCodegen, FusedBodyWithALargeConstantIsRefusedWithAReason) {
  Built b = fused_example(true);
  std::string why;
  EXPECT_FALSE(cuda::supports_pointwise(*b.node, b.g, &why));
  EXPECT_NE(why.find("constant of 8 elements"), std::string::npos) << why;
}

// A per-channel gate recomputed for every element it scales (fuse_pointwise's recomputed small
// groups): y = x * hardsigmoid(s), s [2, 1, 1, 8] against x [2, 5, 5, 8]. A body op whose shape
// does not broadcast to the group's is refused with a reason.
TEST(CudaPointwiseCodegen, FusedBodyWithABroadcastGateCompiles) {
  for (const bool bad : {false, true}) {
    auto body = std::make_shared<Graph>();
    const TensorType xt(DType::kF16, {2, 5, 5, 8}), st(DType::kF16, bad ? Shape{2, 1, 1, 3} : Shape{2, 1, 1, 8});
    const ValueId x = body->add_input("x", xt), s = body->add_input("s", st);
    const ValueId gate = body->add_node1(OpKind::kHardsigmoid, {s});
    if (bad) {  // a body that no pass makes: the gate's shape cannot broadcast to x's
      body->mark_output(x, "y");
      body->mark_output(gate, "g");
    } else {
      body->mark_output(body->add_node1(OpKind::kMul, {x, gate}), "y");
    }
    Built b;
    const std::vector<ValueId> ins{b.g.add_input("x", xt), b.g.add_input("s", st)};
    const auto outs = b.g.insert_fused(0, ins, body, "gate_t");
    for (size_t k = 0; k < outs.size(); ++k) {
      std::string name = "o";
      name += std::to_string(k);
      b.g.mark_output(outs[k], name);
    }
    b.node = b.g.nodes().back().get();
    if (bad) {
      pwg::Program p;
      std::string why;
      EXPECT_FALSE(pwg::program_of(*b.node, b.g, &p, &why));
      EXPECT_NE(why.find("does not broadcast to the group shape"), std::string::npos) << why;
      continue;
    }
    const Generated gen = compiles(b, "broadcast gate");
    EXPECT_EQ(gen.program.steps.size(), 2u);
    EXPECT_GT(gen.layout.vec, 1);
  }
}

// A gathered leaf (fuse_pointwise's index_select by a constant index): a nearest upsample of
// [N, H, W, C] along H read straight from the data and scaled by a per-channel weight, with an
// i64 or i32 index; vectorized when C is a multiple of the vector width, flat when the gather's
// result is the group shape. An index out of range, or one that is no constant, is refused.
TEST(CudaPointwiseCodegen, FusedBodyWithAGatheredLeafCompiles) {
  struct Case {
    int64_t c;
    DType index;
    bool constant, in_range;
  };
  for (const Case& c : {Case{8, DType::kI64, true, true}, Case{3, DType::kI32, true, true},
                        Case{8, DType::kI64, false, true}, Case{8, DType::kI64, true, false}}) {
    const TensorType xt(DType::kF16, {2, 4, 5, c.c}), it(c.index, {8}), wt(DType::kF16, {c.c});
    auto body = std::make_shared<Graph>();
    const ValueId x = body->add_input("x", xt), i = body->add_input("i", it), w = body->add_input("w", wt);
    Attrs a;
    a.set("axis", int64_t(1));
    const ValueId up = body->add_node1(OpKind::kIndexSelect, {x, i}, a);
    body->mark_output(body->add_node1(OpKind::kMul, {up, w}), "y");
    Built b;
    std::vector<int64_t> idx = {0, 0, 1, 1, 2, 2, 3, c.in_range ? -1 : 4};
    std::vector<int32_t> idx32(idx.begin(), idx.end());
    const void* bytes = c.index == DType::kI64 ? static_cast<const void*>(idx.data()) : idx32.data();
    const ValueId index =
        c.constant ? b.g.add_constant("", it, bytes, 8 * dtype_size(c.index)) : b.g.add_input("i", it);
    const std::vector<ValueId> ins{b.g.add_input("x", xt), index, b.g.add_input("w", wt)};
    b.g.mark_output(b.g.insert_fused(0, ins, body, "upsample_t")[0], "y");
    b.node = b.g.nodes().back().get();
    if (!c.constant || !c.in_range) {
      std::string why;
      EXPECT_FALSE(cuda::supports_pointwise(*b.node, b.g, &why));
      EXPECT_NE(why.find(c.constant ? "out of range" : "constant 1-D"), std::string::npos) << why;
      continue;
    }
    const Generated gen = compiles(b, "gathered leaf");
    ASSERT_EQ(gen.program.gathers.size(), 1u);
    EXPECT_EQ(gen.program.gathers[0].inner, 5 * c.c);
    EXPECT_EQ(gen.layout.vec > 1, c.c % 8 == 0);
    EXPECT_NE(gen.source.find("kiln_gather("), std::string::npos);
  }
}

// A gather along the innermost dim whose index runs up by one in aligned blocks (rotate_half's
// swap of a head's halves, x[..., [32..63, 0..31]] * sign) reads vectors of consecutive data;
// an index whose runs are not aligned to the vector width (a rotation by 4) reads element by
// element.
TEST(CudaPointwiseCodegen, GatherOfAlignedIndexRunsIsVectorized) {
  for (const int64_t shift : {32, 4}) {
    const TensorType xt(DType::kF16, {2, 4, 5, 64}), it(DType::kI64, {64}), wt(DType::kF16, {64});
    auto body = std::make_shared<Graph>();
    const ValueId x = body->add_input("x", xt), i = body->add_input("i", it), w = body->add_input("w", wt);
    Attrs a;
    a.set("axis", int64_t(3));
    body->mark_output(body->add_node1(OpKind::kMul, {body->add_node1(OpKind::kIndexSelect, {x, i}, a), w}), "y");
    Built b;
    std::vector<int64_t> idx(64);
    for (int64_t k = 0; k < 64; ++k) idx[size_t(k)] = (k + shift) % 64 - (k % 2 ? 64 : 0);  // some negative
    const std::vector<ValueId> ins{b.g.add_input("x", xt), b.g.add_constant("", it, idx.data(), 64 * 8),
                                   b.g.add_input("w", wt)};
    b.g.mark_output(b.g.insert_fused(0, ins, body, "rotate_t")[0], "y");
    b.node = b.g.nodes().back().get();
    const Generated gen = compiles(b, "rotate half");
    ASSERT_EQ(gen.program.gathers.size(), 1u);
    EXPECT_EQ(gen.program.gathers[0].inner, 1);
    EXPECT_EQ(gen.layout.vec, shift == 32 ? 8 : 1) << shift;
  }
}

// RoPE reading its head-split input through a view (fold_input_views): q = [b, h, s, d] of a
// [b, s, h * 3d] projection (row elements a position), read by the multiply and by rotate_half's
// gather.
Built viewed_rope(int64_t s, int64_t row) {
  const TensorType qt(DType::kF16, {2, 4, s, 64}), it(DType::kI64, {64}), ct(DType::kF16, {s, 64});
  auto body = std::make_shared<Graph>();
  const ValueId q = body->add_input("q", qt), i = body->add_input("i", it), c = body->add_input("c", ct);
  Attrs a;
  a.set("axis", int64_t(3));
  const ValueId rot = body->add_node1(OpKind::kIndexSelect, {q, i}, a);
  body->mark_output(body->add_node1(OpKind::kAdd, {body->add_node1(OpKind::kMul, {q, c}), rot}), "y");
  Built b;
  std::vector<int64_t> idx(64);
  for (int64_t k = 0; k < 64; ++k) idx[size_t(k)] = (k + 32) % 64;
  const ValueId proj = b.g.add_input("proj", TensorType(DType::kF16, {2, s, row}));
  const std::vector<ValueId> ins{proj, b.g.add_constant("", it, idx.data(), 64 * 8), b.g.add_input("c", ct)};
  Attrs view;
  view.set(input_view_key(0), Shape{64, 2, s * row, 4, 64, s, row, 64, 1});  // q: the second third's heads
  b.g.mark_output(b.g.insert_fused(0, ins, body, "rope_t", view)[0], "y");
  b.node = b.g.nodes().back().get();
  return b;
}

// The view's strides index the input and map the gather's positions; the view's offset moves the
// input's pointer. Whole vectors of d stay consecutive in the projection, so the kernel loads 16
// bytes; an odd row stride leaves it element by element.
TEST(CudaPointwiseCodegen, ViewedInputsAndGatheredDataCompile) {
  for (const int64_t row : {3 * 4 * 64, 3 * 4 * 64 + 1}) {
    const Generated gen = compiles(viewed_rope(5, row), "viewed rope");
    ASSERT_EQ(gen.program.gathers.size(), 1u);
    EXPECT_EQ(gen.program.gathers[0].view_strides, (Shape{5 * row, 64, row, 1}));
    EXPECT_NE(gen.source.find("kiln_gview0("), std::string::npos);
    EXPECT_FALSE(gen.layout.flat);
    EXPECT_EQ(gen.layout.offsets, (Shape{64, 0, 0}));
    EXPECT_EQ(gen.layout.vec, row % 8 == 0 ? 8 : 1) << row;
  }
}

// The gather's and its view's sizes are arguments: the same node at another sequence length (an
// instance of a dynamic-shape engine) has the same source and another argument block.
TEST(CudaPointwiseCodegen, AGatherAtAnotherLengthSharesItsSource) {
  const Generated five = generate(viewed_rope(5, 3 * 4 * 64)), seven = generate(viewed_rope(7, 3 * 4 * 64));
  EXPECT_EQ(five.source, seven.source);
  EXPECT_NE(pwg::argument_block(five.program, five.layout), pwg::argument_block(seven.program, seven.layout));
}

// divisor_fields: x / d as (umulhi(x, m) + x) >> s for 32-bit x below 2^31, as the kernels compute
// it, against the division, for small, power-of-two, odd and the largest divisors.
TEST(CudaPointwiseCodegen, DivisorFieldsGiveTheQuotient) {
  const int64_t top = (int64_t(1) << 31) - 1;
  std::vector<int64_t> divisors = {1,          2,       3,    5,    7,    8,     10,    64,      100,
                                   641,        1000,    4095, 4096, 4097, 65535, 65537, 1 << 20, (1 << 20) + 1,
                                   1000000007, top - 1, top};
  std::vector<uint32_t> xs = {
      0, 1, 2, 3, 63, 64, 65, 4095, 4096, 65535, 65536, 1000000006, 1000000007, uint32_t(top - 1), uint32_t(top)};
  uint64_t state = 12345;
  for (int k = 0; k < 2000; ++k) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    xs.push_back(uint32_t(state >> 33));  // below 2^31
    divisors.push_back(int64_t(1 + (state >> 45)));
  }
  for (int64_t d : divisors) {
    const std::array<int64_t, 2> f = pwg::divisor_fields(d);
    ASSERT_EQ(f[0], d);
    const uint32_t m = uint32_t(uint64_t(f[1]) & 0xffffffffu), shift = uint32_t(uint64_t(f[1]) >> 32);
    for (uint32_t x : xs) {
      const uint32_t hi = uint32_t((uint64_t(x) * m) >> 32);
      ASSERT_EQ((hi + x) >> shift, uint32_t(int64_t(x) / d)) << x << " / " << d;
    }
  }
  EXPECT_EQ(pwg::divisor_fields(int64_t(1) << 31)[1], 0);  // 64-bit dividends divide
}

TEST(CudaPointwiseCodegen, LayoutsCollapseBroadcastsAndVectorize) {
  // Same shapes: flat, 4 f32 per 16-byte vector.
  Generated g1 = generate(one_node(OpKind::kAdd, {TensorType(DType::kF32, {8, 16, 32}), TensorType(DType::kF32, {8, 16, 32})}));
  EXPECT_TRUE(g1.layout.flat);
  EXPECT_EQ(g1.layout.vec, 4);
  // f16 -> f32 cast: the widest array (f32) sets the width.
  Attrs to_f32;
  to_f32.set("dtype", DType::kF32);
  EXPECT_EQ(generate(one_node(OpKind::kCast, {TensorType(DType::kF16, {1024})}, to_f32)).layout.vec, 4);
  EXPECT_EQ(generate(one_node(OpKind::kRelu, {TensorType(DType::kBF16, {1024})})).layout.vec, 8);
  // A per-channel scale [C,1,1] against [N,C,H,W]: H and W merge, so rank 3 (N, C, H*W).
  Generated g2 = generate(one_node(OpKind::kMul, {TensorType(DType::kF32, {2, 3, 5, 7}), TensorType(DType::kF32, {3, 1, 1})}));
  EXPECT_FALSE(g2.layout.flat);
  ASSERT_EQ(g2.layout.rank, 3);
  EXPECT_EQ(g2.layout.dims, (Shape{2, 3, 35}));
  EXPECT_EQ(g2.layout.strides[1], (Shape{0, 1, 0}));
  EXPECT_EQ(g2.layout.strides[0], (Shape{105, 35, 1}));
  EXPECT_EQ(g2.layout.vec, 1);  // rows of 35 do not split into vectors of 4
  // With rows of 64 the scale is one value per vector of the innermost dim: a splat input.
  Generated g5 =
      compiles(one_node(OpKind::kMul, {TensorType(DType::kF32, {2, 3, 8, 8}), TensorType(DType::kF32, {3, 1, 1})}),
               "per-channel scale, splat");
  EXPECT_EQ(g5.layout.vec, 4);
  EXPECT_EQ(g5.layout.splat, (std::vector<uint8_t>{0, 1}));
  // A per-channel bias of a channels-last tensor, and a squeeze-excite scale [N,1,1,C]: strided,
  // with the innermost dim contiguous in both inputs, so 16-byte vectors walked once each.
  for (const Shape& other : {Shape{64}, Shape{2, 1, 1, 64}}) {
    Generated g = compiles(one_node(OpKind::kMul, {TensorType(DType::kF16, {2, 5, 5, 64}), TensorType(DType::kF16, other)}),
                           "channels-last per-channel mul");
    EXPECT_FALSE(g.layout.flat);
    EXPECT_EQ(g.layout.vec, 8);
  }
  // Rows of 33 f16 do not split into vectors of 8; rows of 8 against a per-row operand do.
  EXPECT_EQ(generate(one_node(OpKind::kAdd, {TensorType(DType::kF16, {4, 33}), TensorType(DType::kF16, {33})})).layout.vec, 1);
  EXPECT_EQ(generate(one_node(OpKind::kAdd, {TensorType(DType::kF16, {3, 4, 8}), TensorType(DType::kF16, {3, 1, 8})})).layout.vec, 8);
  // A scalar operand keeps the layout flat and is read once.
  Generated g3 = generate(one_node(OpKind::kSub, {TensorType(DType::kF32, {9, 9}), TensorType(DType::kF32, {1, 1})}));
  EXPECT_TRUE(g3.layout.flat);
  EXPECT_EQ(g3.layout.scalar, (std::vector<uint8_t>{0, 1}));
  // More than 2^30 elements: 64-bit indices, and it still compiles.
  Generated g4 = compiles(one_node(OpKind::kAdd, {TensorType(DType::kF16, {3, 1 << 29}), TensorType(DType::kF16, {1 << 29})}),
                          "add with 64-bit indices");
  EXPECT_TRUE(g4.layout.wide);
  EXPECT_FALSE(generate(one_node(OpKind::kAdd, {TensorType(DType::kF16, {3, 100}), TensorType(DType::kF16, {100})})).layout.wide);
}

// A norm's apply step, x * rsqrt(var + eps) * w with var [R, 1] per row: vectors of x and w, the
// row's statistic read once per vector (a splat), whatever the rows' alignment in var.
TEST(CudaPointwiseCodegen, PerRowOperandsAreReadOncePerVector) {
  auto body = std::make_shared<Graph>();
  const TensorType xt(DType::kF16, {4, 3, 64}), vt(DType::kF16, {4, 3, 1}), wt(DType::kF16, {64});
  const ValueId x = body->add_input("x", xt), v = body->add_input("var", vt), w = body->add_input("w", wt);
  const ValueId r = body->add_node1(OpKind::kRsqrt, {v});
  body->mark_output(body->add_node1(OpKind::kMul, {body->add_node1(OpKind::kMul, {x, r}), w}), "y");
  Built b;
  const std::vector<ValueId> ins{b.g.add_input("x", xt), b.g.add_input("var", vt), b.g.add_input("w", wt)};
  b.g.mark_output(b.g.insert_fused(0, ins, body, "rms_t")[0], "y");
  b.node = b.g.nodes().back().get();
  const Generated gen = compiles(b, "norm apply");
  EXPECT_FALSE(gen.layout.flat);
  EXPECT_EQ(gen.layout.vec, 8);
  EXPECT_EQ(gen.layout.splat, (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_NE(gen.source.find("const float x1 = to_float(in1[o1]);"), std::string::npos) << gen.source;
  // An engine saved before splat inputs holds vec 1 for this layout; one saved with vec 2 (no such
  // engine exists, but any divisor of 8 is a width the layout allows) loads with it, and its
  // source compiles; a width that does not divide 8 changes nothing.
  for (const int saved : {1, 2, 3, 16}) {
    Generated narrow = gen;
    pwg::adopt_saved_width(narrow.layout, saved);
    EXPECT_EQ(narrow.layout.vec, saved == 1 || saved == 2 ? saved : 8) << saved;
    const std::vector<uint8_t> splat = saved == 1 ? std::vector<uint8_t>(3, 0) : gen.layout.splat;
    EXPECT_EQ(narrow.layout.splat, splat) << saved;
    if (saved == 2) {
      EXPECT_NO_THROW(cuda::compile_to_cubin(pwg::generate(narrow.program, narrow.layout), "norm apply vec2", 90));
    }
  }
  // A column added to every column of a matrix: the same.
  Generated t = generate(one_node(OpKind::kAdd, {TensorType(DType::kF16, {8, 16}), TensorType(DType::kF16, {8, 1})}));
  EXPECT_EQ(t.layout.vec, 8);
  EXPECT_EQ(t.layout.splat, (std::vector<uint8_t>{0, 1}));
}

TEST(CudaPointwiseCodegen, NodesDifferingOnlyInSizesShareOneSource) {
  auto src = [](Shape a, Shape b) {
    return generate(one_node(OpKind::kAdd, {TensorType(DType::kF32, a), TensorType(DType::kF32, b)})).source;
  };
  EXPECT_EQ(src({4, 33}, {4, 33}), src({128, 1024}, {128, 1024}));
  EXPECT_EQ(src({4, 32}, {32}), src({64, 768}, {768}));
  EXPECT_NE(src({4, 33}, {4, 33}), src({4, 33}, {33}));
  Attrs a1, a2;
  a1.set("negative_slope", 0.1);
  a2.set("negative_slope", 0.3);
  EXPECT_NE(generate(one_node(OpKind::kLeakyRelu, {TensorType(DType::kF32, {10})}, a1)).source,
            generate(one_node(OpKind::kLeakyRelu, {TensorType(DType::kF32, {10})}, a2)).source);
}

// GPT-NeoX's partial rotary q for heads of `d` (a [b, s, h, 3 d] projection, h = 2): the rotated
// first half of q joined to its second half, as fuse_pointwise_concats leaves it (one fused node
// whose body ends in the concat).
Built partial_rotary(int64_t s, int64_t d) {
  Built b;
  Graph& g = b.g;
  const ValueId x = g.add_input("x", TensorType(DType::kF16, {2, s, 6 * d}));
  Attrs shape, perm;
  shape.set("shape", Shape{2, s, 2, 3 * d});
  perm.set("perm", Shape{0, 2, 1, 3});
  const ValueId heads = g.add_node1(OpKind::kPermute, {g.add_node1(OpKind::kReshape, {x}, shape)}, perm);
  auto slice = [&](ValueId v, int64_t start, int64_t end) {
    Attrs a;
    a.set("axis", int64_t{3});
    a.set("start", start);
    a.set("end", end);
    a.set("step", int64_t{1});
    return g.add_node1(OpKind::kSlice, {v}, a);
  };
  const ValueId rot = slice(heads, 0, d / 2);
  std::vector<int64_t> idx;
  for (int64_t k = 0; k < d / 2; ++k) idx.push_back((k + d / 4) % (d / 2));
  const ValueId index = g.add_constant("", TensorType(DType::kI64, {d / 2}), idx.data(), idx.size() * 8);
  const std::vector<uint16_t> ones(size_t(s * d / 2), 0x3c00);
  const ValueId cos = g.add_constant("", TensorType(DType::kF16, {s, d / 2}), ones.data(), ones.size() * 2);
  Attrs last;
  last.set("axis", int64_t{3});
  const ValueId gathered = g.add_node1(OpKind::kIndexSelect, {rot, index}, last);
  const ValueId rotated = g.add_node1(OpKind::kAdd, {g.add_node1(OpKind::kMul, {rot, cos}), gathered});
  g.mark_output(g.add_node1(OpKind::kConcat, {rotated, slice(heads, d / 2, d)}, last), "q");
  fuse_pointwise(g);
  fold_input_views(g);
  EXPECT_TRUE(fuse_pointwise_concats(g)) << g.to_string();
  b.node = g.nodes().back().get();
  return b;
}

TEST(CudaPointwiseCodegen, ConcatBodyComputesEachPartInItsColumns) {
  const Generated gen = compiles(partial_rotary(5, 16), "partial rotary concat");
  EXPECT_EQ(gen.program.concat_dim, 3);
  EXPECT_EQ(gen.program.part_start, (Shape{0, 8, 16}));
  EXPECT_FALSE(gen.layout.flat);
  EXPECT_EQ(gen.layout.vec, 1);
  EXPECT_EQ(gen.layout.dims, (Shape{2, 2, 5, 16}));
  // The passing half is read from q's buffer 8 columns on: its base steps back to column 0.
  const int pass = gen.program.input_part.back() == 1 ? gen.program.num_inputs - 1 : -1;
  ASSERT_GE(pass, 0);
  EXPECT_EQ(gen.layout.bases[size_t(pass)], -8);
  EXPECT_EQ(gen.layout.offsets[size_t(pass)], 8);
  EXPECT_NE(gen.source.find("(part == 0 ?"), std::string::npos);
  EXPECT_NE(gen.source.find(" else if (part == 1) {"), std::string::npos);  // only its own part computes
}

TEST(CudaPointwiseCodegen, ConcatBodiesShareSourcesAndVectorizeInsideParts) {
  // -tanh(x) joined to x's first `keep` columns: sizes and part starts are arguments of one
  // source; 16-byte vectors when every part starts on a multiple of 8 bf16 columns.
  auto gen = [](int64_t rows, int64_t cols, int64_t keep) {
    Built b;
    const ValueId x = b.g.add_input("x", TensorType(DType::kBF16, {rows, cols}));
    Attrs a, axis;
    a.set("axis", int64_t{1});
    a.set("start", int64_t{0});
    a.set("end", keep);
    a.set("step", int64_t{1});
    axis.set("axis", int64_t{1});
    const ValueId t = b.g.add_node1(OpKind::kNeg, {b.g.add_node1(OpKind::kTanh, {x})});
    b.g.mark_output(b.g.add_node1(OpKind::kConcat, {t, b.g.add_node1(OpKind::kSlice, {x}, a)}, axis), "y");
    fuse_pointwise(b.g);
    fold_input_views(b.g);
    EXPECT_TRUE(fuse_pointwise_concats(b.g)) << b.g.to_string();
    b.node = b.g.nodes().back().get();
    return compiles(b, "tanh concat");
  };
  const Generated small = gen(4, 32, 16), large = gen(64, 96, 32), unaligned = gen(3, 10, 4);
  EXPECT_EQ(small.layout.vec, 8);
  EXPECT_EQ(small.source, large.source);
  EXPECT_EQ(unaligned.layout.vec, 1);
  EXPECT_NE(small.source.find(" : kiln_vec<kiln_bf16, 8>{})"), std::string::npos);
}

TEST(CudaPointwiseCodegen, TooManyUnmergeableDimsAreRefused) {
  // Alternating broadcast dims cannot merge: 10 dims after collapsing, over the limit of 8.
  Shape a, b;
  for (int d = 0; d < 10; ++d) a.push_back(d % 2 ? 1 : 2), b.push_back(d % 2 ? 2 : 1);
  Built n = one_node(OpKind::kAdd, {TensorType(DType::kF32, a), TensorType(DType::kF32, b)});
  std::string why;
  EXPECT_FALSE(cuda::supports_pointwise(*n.node, n.g, &why));
  EXPECT_NE(why.find("non-mergeable dims"), std::string::npos) << why;
}

TEST(CudaPointwiseCodegen, CompileErrorsNameTheNodeAndCarryTheLog) {
  try {
    cuda::compile_to_cubin("extern \"C\" __global__ void k() { undefined_thing(); }", "test node 'broken'", 90);
    FAIL() << "expected a compile error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test node 'broken'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("undefined_thing"), std::string::npos) << msg;
  }
}

TEST(CudaPointwiseCodegen, KernelStateRoundTripsAndDamageIsCorrupted) {
  Bytes cubin(300), params(9);
  for (size_t i = 0; i < cubin.size(); ++i) cubin[i] = uint8_t(i * 7 + 1);
  for (size_t i = 0; i < params.size(); ++i) params[i] = uint8_t(200 - i);
  const Bytes state = cuda::pack_state(cubin, params);
  const cuda::CompiledState back = cuda::unpack_state(state);
  EXPECT_EQ(back.cubin, cubin);
  EXPECT_EQ(back.params, params);
  auto corrupted = [](const Bytes& s) {
    try {
      cuda::unpack_state(s);
    } catch (const Error& e) {
      return e.code() == ErrorCode::kCorrupted;
    }
    return false;
  };
  for (size_t len = 0; len < state.size(); ++len)
    EXPECT_TRUE(corrupted(Bytes(state.begin(), state.begin() + std::ptrdiff_t(len)))) << "truncated to " << len;
  for (size_t i = 0; i < state.size(); ++i) {
    Bytes d = state;
    d[i] ^= 0x20;
    EXPECT_TRUE(corrupted(d)) << "byte " << i << " flipped";
  }
  Bytes longer = state;
  longer.push_back(0);
  EXPECT_TRUE(corrupted(longer));
}

}  // namespace

#endif  // KILN_WITH_CUDA
