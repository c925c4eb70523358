// Graph recording (record_graph in src/backends/cuda/cuda_util), which serves an engine's
// capture and the tactic timer: a kernel launched for programmatic dependent launch gets a full
// dependency on its predecessor, the graph replays every launch, and a launch that throws ends
// the recording with the stream usable again; starts_early tells a sequence with such a launch
// from one without. Skipped without a CUDA device.
#ifdef KILN_WITH_CUDA

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <vector>

#include "kiln/kiln.h"
#include "src/backends/cuda/cuda_util.h"
#include "src/backends/cuda/nvrtc.h"

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
