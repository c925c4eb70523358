// The IR: types, attributes, graph building and the printer.
#include <gtest/gtest.h>

#include "kiln/kiln.h"

using namespace kiln;

TEST(DType, NamesRoundTrip) {
  for (int i = 0; i < kNumDTypes; ++i) {
    DType t = static_cast<DType>(i);
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  }
  EXPECT_THROW(dtype_from_name("f8"), Error);
}

TEST(DType, HalfConversionsRoundTripRepresentableValues) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, 0.333251953125f})
    EXPECT_EQ(half_to_float(float_to_half(f)), f) << f;
  EXPECT_EQ(half_to_float(float_to_half(1e6f)), std::numeric_limits<float>::infinity());
  for (float f : {0.0f, 1.0f, -3.0f, 0.15625f, 3.3895314e38f})
    EXPECT_EQ(bf16_to_float(float_to_bf16(f)), f) << f;
}

TEST(Attrs, TypedGettersNameTheKey) {
  Attrs a;
  a.set("axis", int64_t{2});
  a.set("eps", 1e-5);
  EXPECT_EQ(a.get_int("axis"), 2);
  EXPECT_DOUBLE_EQ(a.get_float("axis"), 2.0);
  EXPECT_EQ(a.get_int("missing", 7), 7);
  try {
    a.get_ints("axis");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'axis'"), std::string::npos);
  }
}

TEST(Graph, RejectsBadIds) {
  Graph g;
  g.add_input("x", TensorType(DType::kF32, {2, 3}));
  EXPECT_THROW(g.mark_output(5, "y"), Error);
  EXPECT_THROW(g.add_input("x", TensorType(DType::kF32, {1})), Error);
}
