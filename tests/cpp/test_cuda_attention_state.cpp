// The saved tactic of cuDNN's fused attention (attention_cudnn.h) without a GPU: the params
// round-trip with and without a serialized plan, states written before the plan was stored
// still read (with none), and damage is refused as kCorrupted naming the cause; which nodes
// cuDNN's path declines before posing their operands in its four dims.
#ifdef KILN_WITH_CUDA

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "src/backends/cuda/kernels/attention_cudnn.h"
#include "src/backends/cuda/kernels/attention_fused.h"
#include "src/backends/cuda/kernels/conv_state.h"
#include "tests/cpp/cudnn_state_test_util.h"
#include "tests/cpp/error_test_util.h"

namespace {

using namespace kiln;
using kiln::test::code_of;
using cuda::CudnnAttentionChoice;

CudnnAttentionChoice random_choice(std::mt19937& rng) {
  CudnnAttentionChoice c;
  c.id.engine = int64_t(rng() % 100);
  c.id.knobs = kiln::test::random_knobs(rng);
  c.plan_json = kiln::test::random_plan_json(rng);
  return c;
}

void put_u32(Bytes& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i)));
}

TEST(CudaAttentionState, RoundTrips) {
  std::mt19937 rng(3);
  for (int i = 0; i < 50; ++i) {
    const CudnnAttentionChoice c = random_choice(rng);
    EXPECT_EQ(cuda::decode_cudnn_attention(cuda::encode_cudnn_attention(c)), c);
  }
}

// A state written before the serialized plan was stored (nothing after the knobs) still loads,
// with no serialized plan, so engines and timing caches saved by earlier builds keep loading.
TEST(CudaAttentionState, ReadsTheLayoutWithoutAPlan) {
  CudnnAttentionChoice c;
  c.id.engine = 7;
  c.id.knobs = {{3, -2}, {5, 1}};
  Bytes old = cuda::encode_cudnn_attention(c);
  old.resize(old.size() - 4);  // drop the (zero) plan length: the earlier layout
  EXPECT_EQ(cuda::decode_cudnn_attention(old), c);
}

TEST(CudaAttentionState, RefusesTruncationAndTrailingBytes) {
  CudnnAttentionChoice c;
  c.id.engine = 12;
  c.id.knobs = {{1, 4}};
  c.plan_json = "{\"engine\": 12}";
  const Bytes good = cuda::encode_cudnn_attention(c);
  const size_t knobs_end = good.size() - 4 - c.plan_json.size();
  for (size_t n = 0; n < good.size(); ++n) {
    if (n == knobs_end) continue;  // the earlier layout, which still reads
    const Bytes cut(good.begin(), good.begin() + long(n));
    EXPECT_EQ(code_of([&] { cuda::decode_cudnn_attention(cut); }), ErrorCode::kCorrupted) << n << " bytes";
  }
  Bytes longer = good;
  longer.push_back(0);
  EXPECT_EQ(code_of([&] { cuda::decode_cudnn_attention(longer); }), ErrorCode::kCorrupted);
  Bytes wrong_tag = good;
  wrong_tag[0] = cuda::kCudnnAttentionTag + 1;
  EXPECT_EQ(code_of([&] { cuda::decode_cudnn_attention(wrong_tag); }), ErrorCode::kCorrupted);
}

TEST(CudaAttentionState, RefusesAPlanLengthPastTheEndOrOverTheLimit) {
  CudnnAttentionChoice c;
  c.id.engine = 4;
  Bytes base = cuda::encode_cudnn_attention(c);
  base.resize(base.size() - 4);  // up to the knobs
  for (uint32_t len : {3u, cuda::conv_state_detail::kMaxPlanJson + 1, 0xFFFFFFFFu}) {
    Bytes bad = base;
    put_u32(bad, len);
    bad.push_back('{'), bad.push_back('}');  // 2 bytes of plan, fewer than the length says
    std::string message;
    EXPECT_EQ(code_of([&] { cuda::decode_cudnn_attention(bad); }, &message), ErrorCode::kCorrupted) << len;
    EXPECT_NE(message.find("serialized plan of " + std::to_string(len) + " bytes"), std::string::npos) << message;
  }
}

// An sdpa over three batch dims ([B, Hkv, rep]: grouped heads split out) with an additive mask is
// declined for its batch rank before its mask is posed as cuDNN's [B, H, L, S] bias (which has
// room for two).
TEST(CudaAttentionState, ThreeBatchDimsAreDeclinedBeforeTheirOperandsArePosed) {
  Graph g;
  ValueId q = g.add_input("q", TensorType(DType::kF16, {2, 2, 3, 16, 64}));
  ValueId k = g.add_input("k", TensorType(DType::kF16, {2, 2, 3, 16, 64}));
  ValueId m = g.add_input("m", TensorType(DType::kF16, {1, 1, 1, 16, 16}));
  const ValueId y = g.add_node1(OpKind::kSdpa, {q, k, k, m});
  const cuda::AttentionGeometry geo = cuda::attention_geometry(*g.value(y).producer, g);
  ASSERT_EQ(geo.batch_rank, 3);
  ASSERT_EQ(geo.mask_kind, 2);
  std::string why;
  EXPECT_FALSE(cuda::cudnn_attention_serves(geo, &why));
  EXPECT_EQ(why, "more than 2 batch dims");
  EXPECT_THROW(cuda::attention_operand_bytes(geo, 4), Error);
}

}  // namespace

#endif  // KILN_WITH_CUDA
