// ATen import (include/kiln/import.h): the coverage table, argument reading, PyTorch's type
// promotion, the multi-output rules, the metadata check of the driver, refusals and their
// reasons, and golden IR text of typical mappings. The numerics of importers that decompose an
// overload into several Kiln ops are in test_import_numerics.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>

#include "tests/cpp/import_test_util.h"

using namespace kiln;
using namespace kiln::import_test;

namespace {

// --- the table --------------------------------------------------------------------------

TEST(ImportTable, IsSortedUniqueAndCoversTheTargetModels) {
  const std::vector<std::string> targets = supported_aten_targets();
  EXPECT_TRUE(std::is_sorted(targets.begin(), targets.end()));
  EXPECT_EQ(std::adjacent_find(targets.begin(), targets.end()), targets.end());
  // Every call_function target of resnet18, mobilenet_v3_small, vit_b_16 and BERT (sdpa and
  // eager attention, with and without an attention mask), convnext, swin and a small Llama
  // after torch.export + run_decompositions, plus the overloads the front end keeps whole.
  const char* required[] = {
      "aten._assert_tensor_metadata.default", "aten._log_softmax.default",
      "aten._native_batch_norm_legit_no_training.default", "aten._scaled_dot_product_efficient_attention.default",
      "aten._scaled_dot_product_flash_attention.default", "aten._scaled_dot_product_flash_attention_for_cpu.default",
      "aten._softmax.default", "aten._to_copy.default", "aten._unsafe_view.default", "aten.add.Tensor",
      "aten.addmm.default", "aten.alias.default", "aten.amax.default", "aten.any.dim", "aten.arange.start_step",
      "aten.argmax.default", "aten.avg_pool2d.default", "aten.bitwise_and.Tensor", "aten.bmm.default",
      "aten.cat.default", "aten.clamp.default", "aten.clone.default", "aten.constant_pad_nd.default",
      "aten.convolution.default", "aten.div.Tensor", "aten.embedding.default", "aten.eq.Scalar",
      "aten.expand.default", "aten.full.default", "aten.full_like.default", "aten.gather.default",
      "aten.ge.Scalar", "aten.gelu.default", "aten.index.Tensor", "aten.index_select.default",
      "aten.logical_not.default", "aten.max_pool2d_with_indices.default", "aten.mean.dim", "aten.mm.default",
      "aten.mul.Scalar", "aten.mul.Tensor", "aten.native_group_norm.default", "aten.native_layer_norm.default",
      "aten.permute.default", "aten.relu.default", "aten.scalar_tensor.default",
      "aten.scaled_dot_product_attention.default", "aten.select.int", "aten.slice.Tensor", "aten.split.Tensor",
      "aten.split_with_sizes.default", "aten.squeeze.dims", "aten.sum.dim_IntList", "aten.t.default",
      "aten.tanh.default", "aten.transpose.int", "aten.unsqueeze.default", "aten.var.correction",
      "aten.view.default", "aten.where.self", "aten._adaptive_avg_pool2d.default", "aten.hardswish.default",
      "aten.hardsigmoid.default", "aten.silu.default", "aten.sigmoid.default", "aten.rsqrt.default",
      "aten.as_strided.default", "aten.copy.default", "aten.cumsum.default", "aten.slice_scatter.default",
      "aten.remainder.Scalar",
  };
  for (const char* t : required) EXPECT_TRUE(std::binary_search(targets.begin(), targets.end(), t)) << t;
}

TEST(ImportTable, CanImportNeverThrowsOnMalformedNodes) {
  // Every importer, fed argument lists of every kind (wrong kinds, bad ids, missing
  // arguments, bad output ids), answers with a reason instead of throwing.
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {2, 3});
  const std::vector<std::vector<ImportArg>> arg_sets = {
      {},
      {T(x)},
      {T(99)},
      {T(-5), T(x)},
      {I(1), F(2.0), S("a"), N()},
      {T(x), L({I(1), T(x), N()}), I(-7), F(1e300), B(true), D(DType::kBool)},
      {T(x), T(x), T(x), T(x), T(x), T(x), T(x), T(x), T(x), T(x)},
      {T(x), Ints({}), Ints({-100, 100}), Ints({0, 0, 0, 0, 0}), I(std::numeric_limits<int64_t>::min())},
  };
  for (const std::string& target : supported_aten_targets()) {
    for (const auto& args : arg_sets) {
      for (const std::vector<int32_t>& outs : std::vector<std::vector<int32_t>>{{}, {x}, {1234}, {-1, -1}}) {
        ImportNode n;
        n.target = target;
        n.name = "bad";
        n.args = args;
        n.outputs = outs;
        ImportSupport s;
        EXPECT_NO_THROW(s = can_import(n, fx.g)) << target;
        if (!s.supported) {
          EXPECT_FALSE(s.reason.empty()) << target;
        }
      }
    }
  }
}

TEST(ImportTable, UnknownTargetIsRefusedByName) {
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {4});
  int32_t y = fx.node("aten.frobnicate.default", {T(x)}, DType::kF32, {4});
  fx.output(y, "y");
  EXPECT_NE(unsupported_reason(fx).find("no importer for aten.frobnicate.default"), std::string::npos);
  expect_import_refused(fx, "no importer");
}

// --- whole graphs -----------------------------------------------------------------------

TEST(ImportGraph, ConvBatchNormReluPoolLinearGolden) {
  std::mt19937 rng(1);
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {1, 3, 8, 8});
  int32_t w = fx.weight("conv.weight", {4, 3, 3, 3}, rng);
  int32_t mean = fx.weight("bn.running_mean", {4}, rng), var = fx.weight("bn.running_var", {4}, rng);
  int32_t gamma = fx.weight("bn.weight", {4}, rng), beta = fx.weight("bn.bias", {4}, rng);
  int32_t fcw = fx.weight("fc.weight", {5, 4}, rng), fcb = fx.weight("fc.bias", {5}, rng);
  int32_t c = fx.node("aten.convolution.default",
                      {T(x), T(w), N(), Ints({2, 2}), Ints({1, 1}), Ints({1, 1}), B(false), Ints({0, 0}), I(1)},
                      DType::kF32, {1, 4, 4, 4});
  auto bn = fx.nodes("aten._native_batch_norm_legit_no_training.default",
                     {T(c), T(gamma), T(beta), T(mean), T(var), F(0.1), F(1e-5)},
                     {{DType::kF32, {1, 4, 4, 4}}, {std::nullopt, {}}, {std::nullopt, {}}});
  int32_t r = fx.node("aten.relu.default", {T(bn[0])}, DType::kF32, {1, 4, 4, 4});
  auto mp = fx.nodes("aten.max_pool2d_with_indices.default", {T(r), Ints({2, 2}), Ints({2, 2})},
                     {{DType::kF32, {1, 4, 2, 2}}, {std::nullopt, {}}});
  int32_t m = fx.node("aten.mean.dim", {T(mp[0]), Ints({-1, -2}), B(true)}, DType::kF32, {1, 4, 1, 1});
  int32_t v = fx.node("aten.view.default", {T(m), Ints({1, -1})}, DType::kF32, {1, 4});
  int32_t t = fx.node("aten.permute.default", {T(fcw), Ints({1, 0})}, DType::kF32, {4, 5});
  int32_t out = fx.node("aten.addmm.default", {T(fcb), T(v), T(t)}, DType::kF32, {1, 5});
  fx.output(out, "logits");
  for (const ImportNode& n : fx.g.nodes) EXPECT_TRUE(can_import(n, fx.g).supported) << can_import(n, fx.g).reason;

  Graph g = import_aten(fx.g);
  g.verify();
  EXPECT_EQ(g.to_string(),
            "graph(%0 \"x\": f32[1,3,8,8]) {\n"
            "  %1 \"conv.weight\": f32[4,3,3,3] = weight\n"
            "  %2 \"bn.running_mean\": f32[4] = weight\n"
            "  %3 \"bn.running_var\": f32[4] = weight\n"
            "  %4 \"bn.weight\": f32[4] = weight\n"
            "  %5 \"bn.bias\": f32[4] = weight\n"
            "  %6 \"fc.weight\": f32[5,4] = weight\n"
            "  %7 \"fc.bias\": f32[5] = weight\n"
            "  %8: f32[1,4,4,4] = conv(%0, %1) {dilation=[1,1], groups=1, padding=[1,1], stride=[2,2]}\n"
            "  %9: f32[1,4,4,4] = batch_norm(%8, %2, %3, %4, %5) {eps=1e-05}\n"
            "  %10: f32[1,4,4,4] = relu(%9)\n"
            "  %11: f32[1,4,2,2] = max_pool(%10) {ceil_mode=false, dilation=[1,1], kernel=[2,2], padding=[0,0], "
            "stride=[2,2]}\n"
            "  %12: f32[1,4,1,1] = reduce_mean(%11) {axes=[2,3], keepdim=true}\n"
            "  %13: f32[1,4] = reshape(%12) {shape=[1,4]}\n"
            "  %14: f32[4,5] = permute(%6) {perm=[1,0]}\n"
            "  %15: f32[1,5] = linear(%13, %6, %7)\n"
            "  return %15 \"logits\"\n"
            "}\n");
}

TEST(ImportGraph, InputsConstantsAndOutputsKeepTheirNames) {
  Fx fx;
  int32_t x = fx.input("input_ids", DType::kI64, {2, 3});
  int32_t table = fx.constant("emb.weight", DType::kF32, {10, 2}, Bytes(80, 0));
  int32_t buf = fx.constant("pos_ids", DType::kI64, {3}, Bytes(24, 0), /*weight=*/false);
  int32_t e = fx.node("aten.embedding.default", {T(table), T(x)}, DType::kF32, {2, 3, 2});
  fx.output(e, "hidden");
  fx.output(e, "hidden_again");  // one tensor, two outputs
  fx.output(x, "ids");           // an input returned as is
  fx.output(buf, "pos");
  Graph g = import_aten(fx.g);
  g.verify();
  ASSERT_EQ(g.outputs().size(), 4u);
  EXPECT_EQ(g.value(g.outputs()[0]).name, "hidden");
  EXPECT_EQ(g.value(g.outputs()[1]).name, "hidden_again");
  EXPECT_EQ(g.value(g.outputs()[2]).name, "ids");
  EXPECT_EQ(g.value(g.outputs()[3]).name, "pos");
  EXPECT_EQ(g.type(g.outputs()[0]).to_string(), "f32[2,3,2]");
  const Value& w = g.value(1);
  EXPECT_TRUE(w.is_weight);
  EXPECT_EQ(w.name, "emb.weight");
  EXPECT_FALSE(g.value(2).is_weight);
  EXPECT_EQ(g.value(2).name, "pos_ids");
}

TEST(ImportGraph, SymbolicInputDimsAreCarried) {
  Fx fx;
  ImportTensor t;
  t.dtype = DType::kF32;
  t.shape = {4, 3};
  t.symbols = {"B", ""};
  t.sym_min = {1, 0};
  t.sym_max = {64, 0};
  int32_t x = fx.g.add_tensor(t);
  fx.g.inputs.push_back({x, "x"});
  fx.output(fx.node("aten.relu.default", {T(x)}, DType::kF32, {4, 3}), "y");
  Graph g = import_aten(fx.g);
  EXPECT_EQ(g.type(g.inputs()[0]).to_string(), "f32[B=4:1..64,3]");
  EXPECT_EQ(g.type(g.outputs()[0]).to_string(), "f32[B=4:1..64,3]");
}

TEST(ImportGraph, BadDescriptionsAreInvalidArguments) {
  {
    Fx fx;  // an output nobody defines
    fx.input("x", DType::kF32, {2});
    int32_t ghost = fx.tensor(DType::kF32, {2});
    fx.output(ghost, "y");
    EXPECT_THROW(import_aten(fx.g), Error);
  }
  {
    Fx fx;  // constant bytes of the wrong size
    int32_t c = fx.constant("w", DType::kF32, {3}, Bytes(8, 0));
    fx.output(c, "y");
    try {
      import_aten(fx.g);
      FAIL();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
    }
  }
  {
    Fx fx;  // two weights of one name
    int32_t a = fx.constant("w", DType::kF32, {1}, Bytes(4, 0));
    int32_t b = fx.constant("w", DType::kF32, {1}, Bytes(4, 0));
    fx.output(fx.node("aten.add.Tensor", {T(a), T(b)}, DType::kF32, {1}), "y");
    EXPECT_THROW(import_aten(fx.g), Error);
  }
}

TEST(ImportGraph, MetadataMismatchIsAnInternalErrorNamingTheTarget) {
  // FX claims relu of f32[4] is f32[2,2]: whatever produced that, Kiln must not silently differ.
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {4});
  fx.output(fx.node("aten.relu.default", {T(x)}, DType::kF32, {2, 2}), "y");
  EXPECT_FALSE(can_import(fx.last(), fx.g).supported);
  try {
    import_aten(fx.g);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("aten.relu.default"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32[2,2]"), std::string::npos) << msg;
  }
}


TEST(ImportPromotion, IntTensorPlusFloatScalarIsCastToFloat) {
  Fx fx;
  int32_t x = fx.input("x", DType::kI64, {3});
  fx.node("aten.add.Tensor", {T(x), F(2.5)}, DType::kF32, {3});
  const std::string text = import_last(fx).to_string();
  EXPECT_NE(text.find("%1: f32[3] = cast(%0) {dtype=f32}"), std::string::npos) << text;
  EXPECT_NE(text.find(": f32[] = constant 2.5"), std::string::npos) << text;
  EXPECT_NE(text.find("= add(%1, %2)"), std::string::npos) << text;
}

TEST(ImportPromotion, ScalarsTakeTheTensorDtypeWithoutCasts) {
  Fx fx;
  int32_t x = fx.input("x", DType::kF16, {2, 2});
  fx.node("aten.mul.Scalar", {T(x), I(3)}, DType::kF16, {2, 2});
  const std::string text = import_last(fx).to_string();
  EXPECT_EQ(count(text, "cast"), 0) << text;
  EXPECT_NE(text.find("%1: f16[] = constant 3"), std::string::npos) << text;
  EXPECT_NE(text.find("%2: f16[2,2] = mul(%0, %1)"), std::string::npos) << text;
}

TEST(ImportPromotion, MixedFloatTensorsMeetInTheWiderDtype) {
  Fx fx;
  int32_t a = fx.input("a", DType::kF16, {2, 3});
  int32_t b = fx.input("b", DType::kF32, {3});
  fx.node("aten.sub.Tensor", {T(a), T(b)}, DType::kF32, {2, 3}, {{"alpha", I(2)}});
  const std::string text = import_last(fx).to_string();
  EXPECT_NE(text.find("%2: f32[2,3] = cast(%0) {dtype=f32}"), std::string::npos) << text;
  // alpha multiplies `other`.
  EXPECT_NE(text.find("%3: f32[] = constant 2"), std::string::npos) << text;
  EXPECT_NE(text.find("%4: f32[3] = mul(%1, %3)"), std::string::npos) << text;
  EXPECT_NE(text.find("%5: f32[2,3] = sub(%2, %4)"), std::string::npos) << text;
}

TEST(ImportPromotion, ComparisonsCompareInTheResultType) {
  {
    Fx fx;  // i64 == 1.5 compares as float
    int32_t x = fx.input("x", DType::kI64, {4});
    fx.node("aten.eq.Scalar", {T(x), F(1.5)}, DType::kBool, {4});
    const std::string text = import_last(fx).to_string();
    EXPECT_NE(text.find("cast(%0) {dtype=f32}"), std::string::npos) << text;
    EXPECT_NE(text.find("bool[4] = eq(%1, %2)"), std::string::npos) << text;
  }
  {
    Fx fx;  // f16 tensor vs a 0-d f32 tensor: the 0-d tensor does not promote within floats
    int32_t x = fx.input("x", DType::kF16, {4});
    int32_t y = fx.input("y", DType::kF32, {});
    fx.node("aten.lt.Tensor", {T(x), T(y)}, DType::kBool, {4});
    const std::string text = import_last(fx).to_string();
    EXPECT_NE(text.find("%2: f16[] = cast(%1) {dtype=f16}"), std::string::npos) << text;
    EXPECT_NE(text.find("lt(%0, %2)"), std::string::npos) << text;
  }
  {
    Fx fx;  // i32 tensor vs an i64 0-d tensor: same category, the tensor with dims wins
    int32_t x = fx.input("x", DType::kI32, {4});
    int32_t y = fx.input("y", DType::kI64, {});
    fx.node("aten.ge.Tensor", {T(x), T(y)}, DType::kBool, {4});
    const std::string text = import_last(fx).to_string();
    EXPECT_NE(text.find("i32[] = cast(%1) {dtype=i32}"), std::string::npos) << text;
  }
  {
    Fx fx;  // i32 tensor vs a 0-d f64 tensor: a higher category, so f64
    int32_t x = fx.input("x", DType::kI32, {4});
    int32_t y = fx.input("y", DType::kF64, {});
    fx.node("aten.gt.Tensor", {T(x), T(y)}, DType::kBool, {4});
    const std::string text = import_last(fx).to_string();
    EXPECT_NE(text.find("f64[4] = cast(%0) {dtype=f64}"), std::string::npos) << text;
  }
}

TEST(ImportPromotion, BoolArithmeticIsLogical) {
  Fx fx;
  int32_t a = fx.input("a", DType::kBool, {3});
  int32_t b = fx.input("b", DType::kBool, {3});
  int32_t s = fx.node("aten.add.Tensor", {T(a), T(b)}, DType::kBool, {3});
  fx.node("aten.mul.Tensor", {T(s), T(b)}, DType::kBool, {3});
  const std::string text = import_last(fx).to_string();
  EXPECT_NE(text.find("logical_or(%0, %1)"), std::string::npos) << text;
  EXPECT_NE(text.find("logical_and(%2, %1)"), std::string::npos) << text;
}

TEST(ImportDims, NegativeDimsAreNormalized) {
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {2, 3, 4});
  int32_t p = fx.node("aten.permute.default", {T(x), Ints({-1, 0, 1})}, DType::kF32, {4, 2, 3});
  int32_t t = fx.node("aten.transpose.int", {T(p), I(-1), I(-2)}, DType::kF32, {4, 3, 2});
  int32_t sm = fx.node("aten._softmax.default", {T(t), I(-1), B(false)}, DType::kF32, {4, 3, 2});
  int32_t c = fx.node("aten.cat.default", {L({T(sm), T(sm)}), I(-2)}, DType::kF32, {4, 6, 2});
  int32_t r = fx.node("aten.sum.dim_IntList", {T(c), Ints({-1, 0})}, DType::kF32, {6});
  fx.node("aten.select.int", {T(c), I(-1), I(-1)}, DType::kF32, {4, 6});
  fx.output(r, "sum");
  const std::string text = import_last(fx).to_string();
  EXPECT_NE(text.find("permute(%0) {perm=[2,0,1]}"), std::string::npos) << text;
  EXPECT_NE(text.find("permute(%1) {perm=[0,2,1]}"), std::string::npos) << text;
  EXPECT_NE(text.find("softmax(%2) {axis=2}"), std::string::npos) << text;
  EXPECT_NE(text.find("concat(%3, %3) {axis=1}"), std::string::npos) << text;
  EXPECT_NE(text.find("reduce_sum(%4) {axes=[0,2], keepdim=false}"), std::string::npos) << text;
  EXPECT_NE(text.find("slice(%4) {axis=2, end=2, start=1, step=1}"), std::string::npos) << text;
}

TEST(ImportDims, OutOfRangeDimsAreRefusedWithTheDim) {
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {2, 3});
  fx.node("aten._softmax.default", {T(x), I(2), B(false)}, DType::kF32, {2, 3});
  EXPECT_NE(unsupported_reason(fx).find("dim 2 out of range [-2, 2)"), std::string::npos) << unsupported_reason(fx);
  Fx fx2;
  int32_t y = fx2.input("y", DType::kF32, {2, 3});
  fx2.node("aten.permute.default", {T(y), Ints({1, -1})}, DType::kF32, {3, 2});
  EXPECT_NE(unsupported_reason(fx2).find("appears twice"), std::string::npos) << unsupported_reason(fx2);
}

TEST(ImportSlice, BoundsAreClampedLikePython) {
  struct Case {
    ImportArg start, end;
    int64_t step, want_start, want_end;
  };
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const Case& c : std::vector<Case>{{I(2), I(kMax), 1, 2, 10},  // the "to the end" sentinel
                                         {I(-3), N(), 1, 7, 10},
                                         {N(), I(-8), 2, 0, 2},
                                         {I(-100), I(4), 3, 0, 4},
                                         {I(20), I(kMax), 1, 10, 10},  // empty at the end
                                         {I(6), I(3), 1, 6, 6}}) {    // end before start: empty
    Fx fx;
    int32_t x = fx.input("x", DType::kF32, {10, 2});
    const int64_t n = (c.want_end - c.want_start + c.step - 1) / c.step;
    fx.node("aten.slice.Tensor", {T(x), I(0), c.start, c.end, I(c.step)}, DType::kF32, {n, 2});
    const std::string text = import_last(fx).to_string();
    const std::string want = "slice(%0) {axis=0, end=" + std::to_string(c.want_end) +
                             ", start=" + std::to_string(c.want_start) + ", step=" + std::to_string(c.step) + "}";
    EXPECT_NE(text.find(want), std::string::npos) << text;
  }
  {
    Fx fx;  // the whole dim: no node at all
    int32_t x = fx.input("x", DType::kF32, {10});
    fx.node("aten.slice.Tensor", {T(x), I(0), I(0), I(kMax)}, DType::kF32, {10});
    EXPECT_EQ(count(import_last(fx).to_string(), "slice"), 0);
  }
  {
    Fx fx;
    int32_t x = fx.input("x", DType::kF32, {10});
    fx.node("aten.slice.Tensor", {T(x), I(0), I(0), I(5), I(0)}, DType::kF32, {0});
    EXPECT_NE(unsupported_reason(fx).find("slice step 0"), std::string::npos);
  }
}

// --- multi-output overloads -------------------------------------------------------------

TEST(ImportMultiOutput, OutputsKilnDoesNotComputeMustBeUnused) {
  auto expect_refused = [](Fx& fx, const std::string& what) {
    const std::string reason = unsupported_reason(fx);
    EXPECT_NE(reason.find("is used; Kiln does not compute it"), std::string::npos) << reason;
    EXPECT_NE(reason.find(what), std::string::npos) << reason;
    fx.output(fx.last().outputs[0], "out");
    expect_import_refused(fx, what);
  };
  {
    Fx fx;
    int32_t x = fx.input("x", DType::kF32, {2, 8});
    fx.nodes("aten.native_layer_norm.default", {T(x), Ints({8}), N(), N(), F(1e-5)},
             {{DType::kF32, {2, 8}}, {DType::kF32, {2, 1}}, {std::nullopt, {}}});
    expect_refused(fx, "output 1 (saved statistics)");
  }
  {
    Fx fx;
    int32_t x = fx.input("x", DType::kF32, {1, 1, 4, 4});
    fx.nodes("aten.max_pool2d_with_indices.default", {T(x), Ints({2, 2})},
             {{DType::kF32, {1, 1, 2, 2}}, {DType::kI64, {1, 1, 2, 2}}});
    expect_refused(fx, "output 1 (indices)");
  }
  {
    Fx fx;
    int32_t q = fx.input("q", DType::kF16, {1, 2, 4, 8});
    fx.nodes("aten._scaled_dot_product_flash_attention.default", {T(q), T(q), T(q)},
             {{DType::kF16, {1, 2, 4, 8}}, {DType::kF32, {1, 2, 4}}, {std::nullopt, {}}});
    expect_refused(fx, "logsumexp");
  }
  {
    Fx fx;  // unused extra outputs are fine
    int32_t q = fx.input("q", DType::kF16, {1, 2, 4, 8});
    fx.nodes("aten._scaled_dot_product_flash_attention.default", {T(q), T(q), T(q), F(0.0), B(true)},
             {{DType::kF16, {1, 2, 4, 8}}, {std::nullopt, {}}, {std::nullopt, {}}, {std::nullopt, {}}});
    const std::string text = import_last(fx).to_string();
    EXPECT_NE(text.find("sdpa(%0, %0, %0) {causal=true}"), std::string::npos) << text;
  }
  {
    Fx fx;  // max.dim can give its indices (argmax)
    int32_t x = fx.input("x", DType::kF32, {3, 5});
    auto outs = fx.nodes("aten.max.dim", {T(x), I(-1)}, {{std::nullopt, {}}, {DType::kI64, {3}}});
    fx.output(outs[1], "idx");
    Graph g = import_aten(fx.g);
    EXPECT_NE(g.to_string().find("i64[3] = argmax(%0) {axis=1, keepdim=false}"), std::string::npos) << g.to_string();
    EXPECT_EQ(count(g.to_string(), "reduce_max"), 0);  // the unused values are not computed
  }
  {
    Fx fx;  // var_mean with only the mean used
    int32_t x = fx.input("x", DType::kF32, {3, 5});
    auto outs = fx.nodes("aten.var_mean.correction", {T(x), Ints({1})}, {{std::nullopt, {}}, {DType::kF32, {3}}},
                         {{"correction", I(0)}, {"keepdim", B(false)}});
    fx.output(outs[1], "mean");
    Graph g = import_aten(fx.g);
    EXPECT_NE(g.to_string().find("f32[3] = reduce_mean(%0) {axes=[1], keepdim=false}"), std::string::npos)
        << g.to_string();
    EXPECT_EQ(count(g.to_string(), "reduce_var"), 0);
  }
}

TEST(ImportSplit, OneOutputPerPieceUnusedOnesAllowed) {
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {7, 2});
  auto outs = fx.nodes("aten.split.Tensor", {T(x), I(3)},
                       {{DType::kF32, {3, 2}}, {std::nullopt, {}}, {DType::kF32, {1, 2}}});
  fx.output(outs[2], "tail");
  Graph g = import_aten(fx.g);
  EXPECT_NE(g.to_string().find("split(%0) {axis=0, sizes=[3,3,1]}"), std::string::npos) << g.to_string();
  Fx bad;
  int32_t y = bad.input("y", DType::kF32, {7, 2});
  bad.nodes("aten.split.Tensor", {T(y), I(3)}, {{DType::kF32, {3, 2}}, {DType::kF32, {3, 2}}});
  EXPECT_NE(unsupported_reason(bad).find("split into 3 pieces, but the node lists 2 outputs"), std::string::npos);
}

// --- refusals with reasons ----------------------------------------------------------------

TEST(ImportRefusals, UnsupportedArgumentsSayWhy) {
  struct Case {
    std::string target;
    std::function<void(Fx&)> build;
    std::string reason;
  };
  std::vector<Case> cases = {
      {"float floor division", [](Fx& fx) {
         int32_t x = fx.input("x", DType::kF32, {4});
         fx.node("aten.div.Tensor_mode", {T(x), T(x)}, DType::kF32, {4}, {{"rounding_mode", S("floor")}});
       }, "only integer division"},
      {"integer pow", [](Fx& fx) {
         int32_t x = fx.input("x", DType::kI64, {4});
         fx.node("aten.pow.Tensor_Scalar", {T(x), I(2)}, DType::kI64, {4});
       }, "float only"},
      {"bitwise and of ints", [](Fx& fx) {
         int32_t x = fx.input("x", DType::kI32, {4});
         fx.node("aten.bitwise_and.Tensor", {T(x), T(x)}, DType::kI32, {4});
       }, "only bool"},
      {"boolean mask index", [](Fx& fx) {
         int32_t x = fx.input("x", DType::kF32, {4});
         int32_t m = fx.input("m", DType::kBool, {4});
         fx.node("aten.index.Tensor", {T(x), L({T(m)})}, DType::kF32, {2});
       }, "integer indices only"},
      {"non-adjacent index tensors", [](Fx& fx) {
         int32_t x = fx.input("x", DType::kF32, {4, 5, 6});
         int32_t i = fx.input("i", DType::kI64, {2});
         fx.node("aten.index.Tensor", {T(x), L({T(i), N(), T(i)})}, DType::kF32, {2, 5});
       }, "non-adjacent"},
      {"attention dropout", [](Fx& fx) {
         int32_t q = fx.input("q", DType::kF32, {1, 2, 4, 8});
         fx.node("aten.scaled_dot_product_attention.default", {T(q), T(q), T(q), N(), F(0.1)}, DType::kF32,
                 {1, 2, 4, 8});
       }, "dropout_p 0.1"},
      {"unknown gelu approximation", [](Fx& fx) {
         int32_t x = fx.input("x", DType::kF32, {4});
         fx.node("aten.gelu.default", {T(x)}, DType::kF32, {4}, {{"approximate", S("cubic")}});
       }, "approximate='cubic'"},
      {"training batch norm", [](Fx& fx) {
         int32_t x = fx.input("x", DType::kF32, {2, 3, 4});
         int32_t c = fx.input("c", DType::kF32, {3});
         fx.nodes("aten.native_batch_norm.default", {T(x), T(c), T(c), T(c), T(c), B(true), F(0.1), F(1e-5)},
                  {{DType::kF32, {2, 3, 4}}, {std::nullopt, {}}, {std::nullopt, {}}});
       }, "training mode"},
      {"layer norm over leading dims", [](Fx& fx) {
         int32_t x = fx.input("x", DType::kF32, {2, 3, 4});
         fx.nodes("aten.native_layer_norm.default", {T(x), Ints({3}), N(), N(), F(1e-5)},
                  {{DType::kF32, {2, 3, 4}}, {std::nullopt, {}}, {std::nullopt, {}}});
       }, "not the trailing dims"},
      {"device move", [](Fx& fx) {
         int32_t x = fx.input("x", DType::kF32, {4});
         fx.node("aten._to_copy.default", {T(x)}, DType::kF32, {4}, {{"dtype", N()}, {"device", S("cuda:0")}});
       }, "a device move to 'cuda:0'"},
      {"sparse layout", [](Fx& fx) {
         fx.node("aten.zeros.default", {Ints({4})}, DType::kF32, {4}, {{"layout", S("torch.sparse_coo")}});
       }, "layout torch.sparse_coo"},
      {"a wrong argument kind", [](Fx& fx) {
         int32_t x = fx.input("x", DType::kF32, {4, 4});
         fx.node("aten.transpose.int", {T(x), S("zero"), I(1)}, DType::kF32, {4, 4});
       }, "argument 'dim0' is str, expected int"},
      {"a failed metadata assertion", [](Fx& fx) {
         int32_t x = fx.input("x", DType::kF32, {4});
         ImportNode n;
         n.target = "aten._assert_tensor_metadata.default";
         n.name = "assert";
         n.args = {T(x), N(), N(), D(DType::kI64)};
         fx.g.nodes.push_back(n);
       }, "expects i64, the tensor is f32"},
      {"a shape rule's refusal", [](Fx& fx) {
         int32_t a = fx.input("a", DType::kF32, {2, 3});
         int32_t b = fx.input("b", DType::kF32, {4, 5});
         fx.node("aten.mm.default", {T(a), T(b)}, DType::kF32, {2, 5});
       }, "matmul: inner dims differ"},
  };
  for (const Case& c : cases) {
    Fx fx;
    c.build(fx);
    const std::string reason = unsupported_reason(fx);
    EXPECT_NE(reason.find(c.reason), std::string::npos) << c.target << ": " << reason;
  }
}

// --- mappings -----------------------------------------------------------------------------

TEST(ImportRefusals, TransposedConvolutionOver3SpatialDims) {
  // A 3-D convolution imports (the CPU backend runs it); its transpose does not.
  Fx fx;
  const int32_t x = fx.input("x", DType::kF32, {1, 2, 4, 4, 4});
  const int32_t w = fx.input("w", DType::kF32, {2, 3, 1, 1, 1});
  const std::vector<ImportArg> args = {
      T(x), T(w), N(), Ints({1, 1, 1}), Ints({0, 0, 0}), Ints({1, 1, 1}), B(true), Ints({0, 0, 0}), I(1)};
  fx.node("aten.convolution.default", args, DType::kF32, {1, 3, 4, 4, 4});
  EXPECT_NE(unsupported_reason(fx).find("transposed convolution over 3 spatial dims"), std::string::npos);
}

TEST(ImportLinalg, AddmmOfATransposedWeightIsLinear) {
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {2, 4});
  int32_t w = fx.constant("fc.weight", DType::kF32, {3, 4}, Bytes(48, 0));
  int32_t b = fx.constant("fc.bias", DType::kF32, {3}, Bytes(12, 0));
  int32_t t = fx.node("aten.t.default", {T(w)}, DType::kF32, {4, 3});
  int32_t y = fx.node("aten.addmm.default", {T(b), T(x), T(t)}, DType::kF32, {2, 3});
  fx.node("aten.mm.default", {T(x), T(t)}, DType::kF32, {2, 3});
  fx.output(y, "y");
  const std::string text = import_last(fx).to_string();
  EXPECT_NE(text.find("%4: f32[2,3] = linear(%0, %1, %2)"), std::string::npos) << text;
  EXPECT_NE(text.find("%5: f32[2,3] = linear(%0, %1)"), std::string::npos) << text;
}

TEST(ImportLinalg, AddmmWithFactorsOrAPlainOperandIsMatmulPlusBias) {
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {2, 4});
  int32_t m = fx.input("m", DType::kF32, {4, 3});
  int32_t b = fx.input("b", DType::kF32, {3});
  fx.node("aten.addmm.default", {T(b), T(x), T(m)}, DType::kF32, {2, 3}, {{"beta", F(0.5)}, {"alpha", I(2)}});
  const std::string text = import_last(fx).to_string();
  EXPECT_NE(text.find("%3: f32[2,3] = matmul(%0, %1)"), std::string::npos) << text;
  EXPECT_NE(text.find("%4: f32[] = constant 2"), std::string::npos) << text;
  EXPECT_NE(text.find("%5: f32[2,3] = mul(%3, %4)"), std::string::npos) << text;
  EXPECT_NE(text.find("%6: f32[] = constant 0.5"), std::string::npos) << text;
  EXPECT_NE(text.find("%7: f32[3] = mul(%2, %6)"), std::string::npos) << text;
  EXPECT_NE(text.find("%8: f32[2,3] = add(%5, %7)"), std::string::npos) << text;
}

TEST(ImportMisc, FactoriesConversionsAndAssertions) {
  Fx fx;
  int32_t x = fx.input("x", DType::kF32, {2, 3});
  int32_t mask = fx.input("mask", DType::kI64, {2, 3});
  fx.node("aten.arange.start_step", {I(0), I(16)}, DType::kI64, {16}, {{"device", S("cpu")}, {"pin_memory", B(false)}});
  fx.node("aten.full.default", {Ints({}), B(true)}, DType::kBool, {}, {{"dtype", D(DType::kBool)}});
  fx.node("aten.scalar_tensor.default", {F(-std::numeric_limits<double>::infinity())}, DType::kF32, {});
  fx.node("aten.full_like.default", {T(x), I(7)}, DType::kF32, {2, 3});
  ImportNode check;
  check.target = "aten._assert_tensor_metadata.default";
  check.name = "assert_mask";
  check.args = {T(mask), N(), N(), D(DType::kI64)};
  check.kwargs = {{"device", S("cpu")}, {"layout", S("torch.strided")}};
  fx.g.nodes.push_back(check);
  fx.node("aten._to_copy.default", {T(mask)}, DType::kBool, {2, 3}, {{"dtype", D(DType::kBool)}, {"device", S("cpu")}});
  const std::string text = import_last(fx).to_string();
  EXPECT_NE(text.find("i64[16] = arange() {dtype=i64, end=16, start=0, step=1}"), std::string::npos) << text;
  EXPECT_NE(text.find("bool[] = full() {dtype=bool, shape=[], value=1}"), std::string::npos) << text;
  EXPECT_NE(text.find("f32[] = full() {dtype=f32, shape=[], value=-inf}"), std::string::npos) << text;
  EXPECT_NE(text.find("f32[2,3] = full() {dtype=f32, shape=[2,3], value=7}"), std::string::npos) << text;
  EXPECT_NE(text.find("bool[2,3] = cast(%1) {dtype=bool}"), std::string::npos) << text;
}

TEST(ImportAttention, GroupedQueryAttentionBroadcastsKvHeads) {
  Fx fx;
  int32_t q = fx.input("q", DType::kF32, {1, 4, 3, 8});
  int32_t kv = fx.input("kv", DType::kF32, {1, 2, 5, 8});
  fx.node("aten.scaled_dot_product_attention.default", {T(q), T(kv), T(kv)}, DType::kF32, {1, 4, 3, 8},
          {{"enable_gqa", B(true)}, {"scale", F(0.25)}});
  const std::string text = import_last(fx).to_string();
  EXPECT_NE(text.find("f32[1,2,2,3,8] = reshape(%0)"), std::string::npos) << text;
  EXPECT_NE(text.find("f32[1,2,1,5,8] = reshape(%1)"), std::string::npos) << text;
  EXPECT_NE(text.find("f32[1,2,2,3,8] = sdpa(%2, %3, %4) {causal=false, scale=0.25}"), std::string::npos) << text;
}

TEST(ImportShape, AsStridedIsTakenOnlyAsAReshapeOrPermute) {
  {
    Fx fx;  // [1,1,1,8] re-read as [1,8,1,1] (unit dims' strides are arbitrary): a reshape
    int32_t x = fx.input("x", DType::kF32, {1, 1, 1, 8});
    fx.node("aten.as_strided.default", {T(x), Ints({1, 8, 1, 1}), Ints({8, 1, 8, 8})}, DType::kF32, {1, 8, 1, 1});
    const std::string text = import_last(fx).to_string();
    EXPECT_NE(text.find("f32[1,8,1,1] = reshape(%0) {shape=[1,8,1,1]}"), std::string::npos) << text;
    EXPECT_EQ(count(text, "permute"), 0) << text;
  }
  {
    Fx fx;  // [2,3] re-read with strides (1, 2) as [3,2]: the transpose
    int32_t x = fx.input("x", DType::kF32, {2, 3});
    fx.node("aten.as_strided.default", {T(x), Ints({3, 2}), Ints({1, 3})}, DType::kF32, {3, 2});
    const std::string text = import_last(fx).to_string();
    EXPECT_NE(text.find("f32[3,2] = permute(%0) {perm=[1,0]}"), std::string::npos) << text;
  }
  const std::vector<std::pair<std::vector<ImportArg>, std::string>> refused = {
      {{Ints({2, 2}), Ints({1, 1})}, "not a permuted row-major layout"},  // overlapping windows
      {{Ints({3}), Ints({1}), I(2)}, "storage_offset"},
      {{Ints({3}), Ints({2})}, "not a permuted row-major layout"},
      {{Ints({2}), Ints({1})}, "part of the input"},
  };
  for (const auto& [extra, why] : refused) {
    Fx fx;
    int32_t x = fx.input("x", DType::kF32, {6});
    std::vector<ImportArg> args = {T(x)};
    args.insert(args.end(), extra.begin(), extra.end());
    fx.node("aten.as_strided.default", args, DType::kF32, {2});
    EXPECT_NE(unsupported_reason(fx).find(why), std::string::npos) << unsupported_reason(fx);
  }
}

}  // namespace
