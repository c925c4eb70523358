// lower_precision (src/passes/precision.cpp): golden IR of a small conv / linear net, f16 and
// bf16 nets (linear -> gelu -> layer_norm -> softmax; conv -> relu -> pool) matching the f32
// net on the CPU reference kernels, the f32 interface kept, integer / f64 values and dtype
// attributes handled, graphs already fused refused, and the rest of the pipeline on a lowered graph.
#include "tests/cpp/pass_test_util.h"

namespace {

using namespace kiln;
using namespace kiln::test;

// The pipeline after lowering: constant casts fold (weights stored narrow), epilogues fuse.
Graph lower_and_fold(const Graph& g, DType compute, bool fuse) {
  Graph f = g;
  EXPECT_TRUE(lower_precision(f, compute));
  f.verify();
  fold_constants(f);
  if (fuse) {
    fuse_epilogue(f);
    fuse_pointwise(f);
  }
  eliminate_dead_code(f);
  f.verify();
  return f;
}

// Every value inside the lowered graph f is narrow: an f32 value is a graph input, an f32
// constant read only by a cast, or the output of the cast back to f32 that feeds a graph
// output. Inputs and outputs keep the types they have in the original graph g.
void expect_only_interface_is_f32(const Graph& f, const Graph& g) {
  const auto users = f.users();
  for (ValueId v = 0; v < f.num_values(); ++v) {
    const Value& val = f.value(v);
    if (val.type.dtype != DType::kF32 || val.is_input) continue;
    if (val.is_constant()) {
      for (int u : users[size_t(v)]) EXPECT_EQ(f.nodes()[size_t(u)]->op, OpKind::kCast) << "%" << v;
      continue;
    }
    ASSERT_NE(val.producer, nullptr) << "%" << v;
    EXPECT_EQ(val.producer->op, OpKind::kCast) << "%" << v << " in\n" << f.to_string();
    EXPECT_TRUE(std::find(f.outputs().begin(), f.outputs().end(), v) != f.outputs().end()) << "%" << v;
  }
  ASSERT_EQ(f.inputs().size(), g.inputs().size());
  for (size_t i = 0; i < g.inputs().size(); ++i) EXPECT_EQ(f.type(f.inputs()[i]), g.type(g.inputs()[i]));
  ASSERT_EQ(f.outputs().size(), g.outputs().size());
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    EXPECT_EQ(f.type(f.outputs()[i]), g.type(g.outputs()[i]));
    EXPECT_EQ(f.value(f.outputs()[i]).name, g.value(g.outputs()[i]).name);
  }
}

TEST(LowerPrecision, ConvLinearNetGolden) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {1, 2, 4, 4}));
  ValueId y = g.add_node1(OpKind::kConv, {x, f32_weight(g, "conv.w", {3, 2, 3, 3}, 1), f32_weight(g, "conv.b", {3}, 2)},
                          conv2d_attrs(1, 1, 1));
  y = g.add_node1(OpKind::kRelu, {y});
  Attrs flat;
  flat.set("shape", Shape{1, 48});
  y = g.add_node1(OpKind::kReshape, {y}, flat);
  y = g.add_node1(OpKind::kLinear, {y, f32_weight(g, "fc.w", {5, 48}, 3), f32_weight(g, "fc.b", {5}, 4)});
  g.mark_output(y, "logits");
  Graph f = g;
  EXPECT_TRUE(lower_precision(f, DType::kF16));
  f.verify();
  EXPECT_EQ(f.to_string(),
            "graph(%0 \"x\": f32[1,2,4,4]) {\n"
            "  %1 \"conv.w\": f32[3,2,3,3] = weight\n"
            "  %2 \"conv.b\": f32[3] = weight\n"
            "  %3 \"fc.w\": f32[5,48] = weight\n"
            "  %4 \"fc.b\": f32[5] = weight\n"
            "  %5: f16[1,2,4,4] = cast(%0) {dtype=f16}\n"
            "  %6: f16[3,2,3,3] = cast(%1) {dtype=f16}\n"
            "  %7: f16[3] = cast(%2) {dtype=f16}\n"
            "  %8: f16[1,3,4,4] = conv(%5, %6, %7) {dilation=[1,1], groups=1, padding=[1,1], stride=[1,1]}\n"
            "  %9: f16[1,3,4,4] = relu(%8)\n"
            "  %10: f16[1,48] = reshape(%9) {shape=[1,48]}\n"
            "  %11: f16[5,48] = cast(%3) {dtype=f16}\n"
            "  %12: f16[5] = cast(%4) {dtype=f16}\n"
            "  %13: f16[1,5] = linear(%10, %11, %12)\n"
            "  %14: f32[1,5] = cast(%13) {dtype=f32}\n"
            "  return %14 \"logits\"\n"
            "}\n");
  // Folding stores the weights as f16 constants; fusion then puts relu in the conv. (Ids follow
  // creation order: compact() keeps the relative order of surviving values.)
  fold_constants(f);
  fuse_epilogue(f);
  EXPECT_EQ(f.to_string(),
            "graph(%0 \"x\": f32[1,2,4,4]) {\n"
            "  %5: f16[3,2,3,3] = constant\n"
            "  %6: f16[3] = constant\n"
            "  %7: f16[5,48] = constant\n"
            "  %8: f16[5] = constant\n"
            "  %1: f16[1,2,4,4] = cast(%0) {dtype=f16}\n"
            "  %9: f16[1,3,4,4] = conv(%1, %5, %6) {activation=\"relu\", dilation=[1,1], groups=1, padding=[1,1], "
            "stride=[1,1]}\n"
            "  %2: f16[1,48] = reshape(%9) {shape=[1,48]}\n"
            "  %3: f16[1,5] = linear(%2, %7, %8)\n"
            "  %4: f32[1,5] = cast(%3) {dtype=f32}\n"
            "  return %4 \"logits\"\n"
            "}\n");
  auto in = random_inputs(g, 5);
  EXPECT_LT(relative_error(run_plain(f, in)[0], run_plain(g, in)[0]), 1e-2);
}

Graph transformer_block_net() {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 4, 16}));
  ValueId y = g.add_node1(OpKind::kLinear, {x, f32_weight(g, "fc.w", {32, 16}, 6, -0.5f, 0.5f),
                                            f32_weight(g, "fc.b", {32}, 7)});
  y = g.add_node1(OpKind::kGelu, {y});
  Attrs ln;
  ln.set("normalized_rank", int64_t(1));
  ln.set("eps", 1e-5);
  y = g.add_node1(OpKind::kLayerNorm, {y, f32_weight(g, "ln.w", {32}, 8, 0.5f, 1.5f), f32_weight(g, "ln.b", {32}, 9)},
                  ln);
  Attrs sm;
  sm.set("axis", int64_t(2));
  g.mark_output(g.add_node1(OpKind::kSoftmax, {y}, sm), "probs");
  g.mark_output(y, "normed");
  return g;
}

Graph conv_pool_net() {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2, 3, 8, 8}));
  ValueId y = g.add_node1(OpKind::kConv, {x, f32_weight(g, "w", {6, 3, 3, 3}, 10), f32_weight(g, "b", {6}, 11)},
                          conv2d_attrs(1, 1, 1));
  y = g.add_node1(OpKind::kRelu, {y});
  Attrs pool;
  pool.set("kernel", Shape{2, 2});
  pool.set("stride", Shape{2, 2});
  g.mark_output(g.add_node1(OpKind::kMaxPool, {y}, pool), "pooled");
  return g;
}

TEST(LowerPrecision, HalfAndBfloatNetsMatchF32) {
  for (DType dt : {DType::kF16, DType::kBF16})
    for (bool fuse : {false, true})
      for (int net = 0; net < 2; ++net) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + (fuse ? " fused" : "") + " net " + std::to_string(net));
        const Graph g = net == 0 ? transformer_block_net() : conv_pool_net();
        const Graph f = lower_and_fold(g, dt, fuse);
        expect_only_interface_is_f32(f, g);
        for (ValueId c : f.constants()) EXPECT_EQ(f.type(c).dtype, dt) << "weights are stored narrow";
        auto in = random_inputs(g, 30 + uint32_t(net));
        auto want = run_plain(g, in), got = run_plain(f, in);
        ASSERT_EQ(got.size(), want.size());
        // bf16 keeps 8 significant bits (f16: 11): its rounding alone is 2^-9 relative.
        const double tol = dt == DType::kF16 ? 1e-2 : 3e-2;
        for (size_t k = 0; k < got.size(); ++k) {
          const double err = relative_error(got[k], want[k]);
          EXPECT_LT(err, tol) << "output " << k;
          EXPECT_GT(err, 0.0) << "output " << k << " was not computed in " << dtype_name(dt);
        }
      }
}

TEST(LowerPrecision, IntegerF64AndDtypeAttributes) {
  Graph g;
  ValueId idx = g.add_input("idx", TensorType(DType::kI64, {3}));
  ValueId d = g.add_input("d", TensorType(DType::kF64, {3}));
  ValueId table = f32_weight(g, "table", {10, 4}, 12);
  Attrs axis0;
  axis0.set("axis", int64_t(0));
  ValueId rows = g.add_node1(OpKind::kIndexSelect, {table, idx}, axis0);  // f32 -> f16
  Attrs am;
  am.set("axis", int64_t(1));
  am.set("keepdim", false);
  g.mark_output(g.add_node1(OpKind::kArgmax, {rows}, am), "best");      // i64 stays i64
  g.mark_output(g.add_node1(OpKind::kAdd, {idx, idx}), "twice");        // integer op untouched
  g.mark_output(g.add_node1(OpKind::kMul, {d, d}), "square");           // f64 untouched
  Attrs to_f32;
  to_f32.set("dtype", DType::kF32);
  ValueId as_float = g.add_node1(OpKind::kCast, {idx}, to_f32);          // cast to f32 -> to f16
  Attrs ar;
  ar.set("start", 0.0);
  ar.set("end", 3.0);
  ar.set("dtype", DType::kF32);
  ValueId ramp = g.add_node1(OpKind::kArange, {}, ar);                   // arange f32 -> f16
  Attrs ar_int = ar;
  ar_int.set("dtype", DType::kI64);
  g.mark_output(g.add_node1(OpKind::kArange, {}, ar_int), "ints");       // arange i64 stays
  g.mark_output(g.add_node1(OpKind::kAdd, {as_float, ramp}), "sum");
  const Graph original = g;

  ASSERT_TRUE(lower_precision(g, DType::kBF16));
  g.verify();
  expect_only_interface_is_f32(g, original);
  const std::vector<std::pair<OpKind, DType>> want = {
      {OpKind::kIndexSelect, DType::kBF16}, {OpKind::kArgmax, DType::kI64}, {OpKind::kMul, DType::kF64},
  };
  for (const auto& [op, dt] : want)
    for (const auto& n : g.nodes())
      if (n->op == op) {
        EXPECT_EQ(g.type(n->outputs[0]).dtype, dt) << op_name(op);
      }
  int casts_to_bf16 = 0, aranges[2] = {0, 0};
  for (const auto& n : g.nodes()) {
    if (n->op == OpKind::kCast) casts_to_bf16 += n->attrs.get_dtype("dtype") == DType::kBF16;
    if (n->op == OpKind::kArange) ++aranges[n->attrs.get_dtype("dtype") == DType::kI64 ? 1 : 0];
    if (n->op == OpKind::kAdd && g.type(n->inputs[0]).dtype == DType::kI64) {
      EXPECT_EQ(g.type(n->outputs[0]).dtype, DType::kI64);
    }
  }
  EXPECT_EQ(casts_to_bf16, 2) << g.to_string();  // the weight's cast and the former cast to f32
  EXPECT_EQ(aranges[0], 1);
  EXPECT_EQ(aranges[1], 1);
  for (const auto& n : g.nodes())
    if (n->op == OpKind::kArange && n->attrs.get_dtype("dtype") != DType::kI64) {
      EXPECT_EQ(n->attrs.get_dtype("dtype"), DType::kBF16);
    }
}

// A dynamic block's position rows: a table gathered at an arange of the length (sized). Lowered
// to f16 and constant-folded, the gather must stay a node (its size is the range's), as it does
// in f32; the table's cast folds.
TEST(LowerPrecision, SizedValuesStaySizedAndUnfolded) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {6, 4}));
  const ValueId idx = i64_arange(g, 0, 6, true);
  Attrs rows;
  rows.set("axis", int64_t(0));
  const ValueId table = f32_constant(g, "table", {8, 4}, random_floats(32, 3), true);
  const ValueId pos = g.add_node1(OpKind::kIndexSelect, {table, idx}, rows);
  g.value(pos).sized = true;
  g.mark_output(g.add_node1(OpKind::kAdd, {x, pos}), "y");
  const Graph original = g;
  ASSERT_TRUE(lower_precision(g, DType::kF16));
  fold_constants(g);
  g.verify();
  EXPECT_EQ(count_ops(g, OpKind::kArange), 1);
  ASSERT_EQ(count_ops(g, OpKind::kIndexSelect), 1);
  for (const auto& n : g.nodes())
    if (n->op == OpKind::kIndexSelect || n->op == OpKind::kArange) {
      EXPECT_TRUE(g.value(n->outputs[0]).sized);
    }
  const auto in = random_inputs(original, 5);
  expect_close(run_plain(g, in), run_plain(original, in), 2e-3f, 2e-3f);
}

// An f16 model's RMSNorm upcasts its input (x.float()), computes in f32 and casts back: lowered
// to f16, those casts and the model's cast of its f32 input (which the pass casts already) cast
// values to the type they have. None stays a node (each would be a copy kernel); the values
// computed are the f32 graph's within f16 rounding.
TEST(LowerPrecision, CastsToTheTypeTheirInputHasAreDropped) {
  Graph g;
  const ValueId x = g.add_input("x", TensorType(DType::kF32, {4, 16}));
  Attrs to16, to32;
  to16.set("dtype", DType::kF16);
  to32.set("dtype", DType::kF32);
  const ValueId h = g.add_node1(OpKind::kCast, {x}, to16);
  const ValueId u = g.add_node1(OpKind::kCast, {h}, to32);
  Attrs mean;
  mean.set("axes", std::vector<int64_t>{1});
  mean.set("keepdim", true);
  const ValueId ms = g.add_node1(OpKind::kReduceMean, {g.add_node1(OpKind::kMul, {u, u})}, mean);
  const ValueId eps = f32_constant(g, "", {}, {1e-6f}, false);
  const ValueId inv = g.add_node1(OpKind::kRsqrt, {g.add_node1(OpKind::kAdd, {ms, eps})});
  const ValueId y = g.add_node1(OpKind::kCast, {g.add_node1(OpKind::kMul, {u, inv})}, to16);
  g.mark_output(g.add_node1(OpKind::kCast, {g.add_node1(OpKind::kMul, {y, h})}, to32), "y");
  ASSERT_EQ(count_ops(g, OpKind::kCast), 4);
  const Graph original = g;

  ASSERT_TRUE(lower_precision(g, DType::kF16));
  g.verify();
  expect_only_interface_is_f32(g, original);
  for (const auto& n : g.nodes())
    if (n->op == OpKind::kCast) {
      EXPECT_NE(g.type(n->inputs[0]).dtype, g.type(n->outputs[0]).dtype) << g.to_string();
    }
  // x's cast to f16, eps's (a constant, folded later) and the output's back to f32.
  EXPECT_EQ(count_ops(g, OpKind::kCast), 3) << g.to_string();
  const auto in = random_inputs(original, 21);
  expect_close(run_plain(g, in), run_plain(original, in), 4e-3f, 4e-3f);

  // v.float().half() as f16 graph outputs: of a computed v, the output is v itself (no copy);
  // of a graph input, or beside v returned as well, each output is a copy of its own.
  Graph round_trip;
  const ValueId h16 = round_trip.add_input("h", TensorType(DType::kF16, {3}));
  const ValueId sq = round_trip.add_node1(OpKind::kMul, {h16, h16});
  auto there_and_back = [&](ValueId v) {
    return round_trip.add_node1(OpKind::kCast, {round_trip.add_node1(OpKind::kCast, {v}, to32)}, to16);
  };
  round_trip.mark_output(there_and_back(sq), "square");
  round_trip.mark_output(there_and_back(h16), "input");
  round_trip.mark_output(sq, "square_again");
  round_trip.mark_output(there_and_back(sq), "square_once_more");
  ASSERT_TRUE(lower_precision(round_trip, DType::kF16));
  round_trip.verify();
  const std::vector<ValueId>& outs = round_trip.outputs();
  ASSERT_EQ(outs.size(), 4u);
  EXPECT_EQ(round_trip.value(outs[0]).producer->op, OpKind::kMul) << round_trip.to_string();
  for (size_t i : {1, 2, 3}) EXPECT_EQ(round_trip.value(outs[i]).producer->op, OpKind::kCopy) << round_trip.to_string();
  EXPECT_EQ(count_ops(round_trip, OpKind::kCast), 0) << round_trip.to_string();
}

TEST(LowerPrecision, RefusesGraphsWithFusedNodes) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {3, 5}));
  ValueId y = g.add_node1(OpKind::kMul, {x, f32_constant(g, "", {}, {1.5f}, false)});
  g.mark_output(g.add_node1(OpKind::kTanh, {y}), "y");
  ASSERT_TRUE(fuse_pointwise(g));
  expect_error([&] { lower_precision(g, DType::kF16); }, ErrorCode::kInvalidArgument,
               {"lower_precision", "before fuse_pointwise"});
}

TEST(LowerPrecision, RejectsWideComputeTypesAndLeavesNarrowGraphsAlone) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::kF32, {2}));
  g.mark_output(g.add_node1(OpKind::kRelu, {x}), "y");
  for (DType dt : {DType::kF32, DType::kF64, DType::kI32})
    expect_error([&] { lower_precision(g, dt); }, ErrorCode::kInvalidArgument, {"lower_precision", dtype_name(dt)});
  Graph ints;
  ValueId i = ints.add_input("i", TensorType(DType::kI32, {4}));
  ints.mark_output(ints.add_node1(OpKind::kNeg, {i}), "y");
  const std::string before = ints.to_string();
  EXPECT_FALSE(lower_precision(ints, DType::kF16));
  EXPECT_EQ(ints.to_string(), before);
  ASSERT_TRUE(lower_precision(g, DType::kF16));
  EXPECT_EQ(count_ops(g, OpKind::kCast), 2);  // one in, one out
}

}  // namespace
