// Graph recording (record_graph in src/backends/cuda/cuda_util), which serves an engine's
// capture and the tactic timer: a kernel launched for programmatic dependent launch gets a full
// dependency on its predecessor, the graph replays every launch, and a launch that throws ends
// the recording with the stream usable again, and a small memset becomes a fill kernel that
// writes the same bytes in the same place of the chain; starts_early tells a sequence with such
// a launch from one without. Skipped without a CUDA device.
#ifdef KILN_WITH_CUDA

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "kiln/kiln.h"
#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/device/cuda_util.h"

namespace {

using namespace kiln;

constexpr const char* kSource = R"(
extern "C" __global__ void bump(int* p) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0) atomicAdd(p, 1);
}
)";

void launch_bump(cudaKernel_t k, int* p, cudaStream_t s, bool programmatic) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(32);
  config.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attr;
  config.numAttrs = programmatic ? 1 : 0;
  void* args[] = {&p};
  ASSERT_EQ(cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(k), args), cudaSuccess);
}

// One device int and the kernel that bumps it (valid while `module` lives).
struct Bump {
  std::shared_ptr<void> buf = get_backend(Device::parse("cuda:0")).allocate(sizeof(int));
  int* p = static_cast<int*>(buf.get());
  std::shared_ptr<const cuda::Module> module = cuda::Module::compile(kSource, "test kernel");
  cudaKernel_t kernel = module->kernel("bump");
};

TEST(CudaGraphEdges, EarlyLaunchEdgesBecomeFullDependencies) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  const Bump b;
  int* p = b.p;
  const cudaKernel_t bump = b.kernel;
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);

  const cuda::GraphPtr graph = cuda::record_graph(s, [&](cudaStream_t rs) {
    launch_bump(bump, p, rs, false);
    launch_bump(bump, p, rs, true);
    launch_bump(bump, p, rs, true);
  });
  size_t n = 0;
  ASSERT_EQ(cudaGraphGetEdges(graph.get(), nullptr, nullptr, nullptr, &n), cudaSuccess);
  ASSERT_EQ(n, 2u);
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  ASSERT_EQ(cudaGraphGetEdges(graph.get(), from.data(), to.data(), data.data(), &n), cudaSuccess);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(data[i].type, cudaGraphDependencyTypeDefault) << "edge " << i;
    EXPECT_EQ(data[i].from_port, 0) << "edge " << i;
  }

  // The graph replays, each launch once.
  ASSERT_EQ(cudaMemsetAsync(p, 0, sizeof(int), s), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph.get(), 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  int count = 0;
  ASSERT_EQ(cudaMemcpyAsync(&count, p, sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(count, 3);
  (void)cudaGraphExecDestroy(exec);
  (void)cudaStreamDestroy(s);
}

TEST(CudaGraphEdges, ALaunchThatThrowsEndsTheRecordingAndLeavesTheStreamUsable) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_THROW(cuda::record_graph(s, [](cudaStream_t) { throw std::runtime_error("launch failed"); }),
               std::runtime_error);
  cudaStreamCaptureStatus status{};
  ASSERT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  (void)cudaStreamDestroy(s);
}

// The graph's nodes of `type`.
size_t count_nodes(cudaGraph_t graph, cudaGraphNodeType type) {
  size_t n = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) {
    EXPECT_EQ(cudaGraphGetNodes(graph, nodes.data(), &n), cudaSuccess);
  }
  size_t count = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    EXPECT_EQ(cudaGraphNodeGetType(node, &t), cudaSuccess);
    count += t == type;
  }
  return count;
}

void replay(cudaGraph_t graph, cudaStream_t s) {
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  (void)cudaGraphExecDestroy(exec);
}

TEST(CudaGraphEdges, SmallMemsetsBecomeFillKernelsInTheirPlaceOfTheChain) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  const Bump b;
  constexpr size_t kSmall = 1024, kLarge = cuda::kMaxFillBytes + 4096;
  Backend& be = get_backend(Device::parse("cuda:0"));
  std::shared_ptr<void> small = be.allocate(kSmall), large = be.allocate(kLarge);
  auto* sp = static_cast<uint8_t*>(small.get());
  ASSERT_EQ(cudaMemset(sp, 0xEE, kSmall), cudaSuccess);
  ASSERT_EQ(cudaMemset(large.get(), 0xEE, kLarge), cudaSuccess);
  ASSERT_EQ(cudaMemset(b.p, 0, sizeof(int)), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);

  const cuda::GraphPtr graph = cuda::record_graph(s, [&](cudaStream_t rs) {
    launch_bump(b.kernel, b.p, rs, false);
    ASSERT_EQ(cudaMemsetAsync(sp + 3, 0x5A, 10, rs), cudaSuccess);
    ASSERT_EQ(cudaMemset2DAsync(sp + 64, 32, 0x11, 5, 3, rs), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(large.get(), 0x22, kLarge, rs), cudaSuccess);  // over the limit: stays
    launch_bump(b.kernel, b.p, rs, false);
  });
  EXPECT_EQ(count_nodes(graph.get(), cudaGraphNodeTypeMemset), 1u);
  EXPECT_EQ(count_nodes(graph.get(), cudaGraphNodeTypeKernel), 4u);
  // Still one chain: five nodes, four edges, each node at most one in front and one after.
  size_t n = 0, ne = 0;
  ASSERT_EQ(cudaGraphGetNodes(graph.get(), nullptr, &n), cudaSuccess);
  ASSERT_EQ(cudaGraphGetEdges(graph.get(), nullptr, nullptr, nullptr, &ne), cudaSuccess);
  EXPECT_EQ(n, 5u);
  ASSERT_EQ(ne, 4u);
  std::vector<cudaGraphNode_t> from(ne), to(ne);
  ASSERT_EQ(cudaGraphGetEdges(graph.get(), from.data(), to.data(), nullptr, &ne), cudaSuccess);
  for (size_t i = 0; i < ne; ++i) {
    for (size_t j = i + 1; j < ne; ++j) {
      EXPECT_NE(from[i], from[j]);
      EXPECT_NE(to[i], to[j]);
    }
  }

  replay(graph.get(), s);
  std::vector<uint8_t> got(kSmall), want(kSmall, 0xEE);
  for (size_t i = 3; i < 13; ++i) want[i] = 0x5A;
  for (size_t r = 0; r < 3; ++r)
    for (size_t c = 0; c < 5; ++c) want[64 + 32 * r + c] = 0x11;
  ASSERT_EQ(cudaMemcpy(got.data(), sp, kSmall, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, want);
  std::vector<uint8_t> big(kLarge);
  ASSERT_EQ(cudaMemcpy(big.data(), large.get(), kLarge, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(big, std::vector<uint8_t>(kLarge, 0x22));
  int count = 0;
  ASSERT_EQ(cudaMemcpy(&count, b.p, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(count, 2);
  (void)cudaStreamDestroy(s);
}

TEST(CudaGraphEdges, FillKernelsWriteTwoAndFourByteElements) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  constexpr size_t kBytes = 512;
  std::shared_ptr<void> buf = get_backend(Device::parse("cuda:0")).allocate(kBytes);
  auto* bp = static_cast<uint8_t*>(buf.get());
  ASSERT_EQ(cudaMemset(bp, 0xEE, kBytes), cudaSuccess);
  cudaGraph_t raw = nullptr;
  ASSERT_EQ(cudaGraphCreate(&raw, 0), cudaSuccess);
  const cuda::GraphPtr graph(raw);
  cudaMemsetParams m4{};  // two rows of seven 4-byte words, 64 bytes apart
  m4.dst = bp;
  m4.pitch = 64;
  m4.value = 0x12345678u;
  m4.elementSize = 4;
  m4.width = 7;
  m4.height = 2;
  cudaMemsetParams m2{};  // five 2-byte halves at byte 256
  m2.dst = bp + 256;
  m2.value = 0xBEEFu;
  m2.elementSize = 2;
  m2.width = 5;
  m2.height = 1;
  cudaGraphNode_t a = nullptr, c = nullptr;
  ASSERT_EQ(cudaGraphAddMemsetNode(&a, raw, nullptr, 0, &m4), cudaSuccess);
  ASSERT_EQ(cudaGraphAddMemsetNode(&c, raw, &a, 1, &m2), cudaSuccess);
  cuda::small_memsets_as_kernels(raw);
  EXPECT_EQ(count_nodes(raw, cudaGraphNodeTypeMemset), 0u);
  EXPECT_EQ(count_nodes(raw, cudaGraphNodeTypeKernel), 2u);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  replay(raw, s);
  std::vector<uint8_t> got(kBytes), want(kBytes, 0xEE);
  const uint8_t word[4] = {0x78, 0x56, 0x34, 0x12}, half[2] = {0xEF, 0xBE};  // little-endian
  for (size_t r = 0; r < 2; ++r)
    for (size_t i = 0; i < 7 * 4; ++i) want[64 * r + i] = word[i % 4];
  for (size_t i = 0; i < 5 * 2; ++i) want[256 + i] = half[i % 2];
  ASSERT_EQ(cudaMemcpy(got.data(), bp, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(got, want);
  (void)cudaStreamDestroy(s);
}

TEST(CudaGraphEdges, StartsEarlyTellsAnEarlyLaunchApart) {
  if (!backend_available(DeviceType::kCUDA)) GTEST_SKIP() << "no CUDA device";
  const Bump b;
  int* p = b.p;
  const cudaKernel_t bump = b.kernel;
  ASSERT_EQ(cudaMemset(p, 0, sizeof(int)), cudaSuccess);
  EXPECT_FALSE(cuda::starts_early([&](cudaStream_t s) {
    launch_bump(bump, p, s, false);
    launch_bump(bump, p, s, false);
  }));
  EXPECT_TRUE(cuda::starts_early([&](cudaStream_t s) {
    launch_bump(bump, p, s, false);
    launch_bump(bump, p, s, true);
  }));
  // Nothing ran: the recordings only looked.
  int count = -1;
  ASSERT_EQ(cudaMemcpy(&count, p, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(count, 0);
}

}  // namespace

#endif  // KILN_WITH_CUDA
