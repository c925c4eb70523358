// Error reporting for CUDA runtime calls and the cached properties of each device.
//
// fail_cuda turns a failed call into a kiln::Error: out of memory is the caller's problem
// (kInvalidArgument: a smaller batch or workspace may fit), anything else is kInternal. The
// device properties are read once per device index (cudaGetDeviceProperties is slow enough
// to matter when every make_kernel asks) and kept for the life of the process. Graph recording
// (record_graph), the one place that sets the dependencies of a recorded graph and turns its
// small memsets into kernels, serves both an engine's capture and the tactic timer.
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/tuning/build_turn.h"

namespace kiln::cuda {

void fail_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  // Clear a non-sticky error so that the next unrelated check does not report it again.
  (void)cudaGetLastError();
  const std::string where = std::string(file) + ":" + std::to_string(line);
  if (err == cudaErrorMemoryAllocation) {
    KILN_FAIL(kInvalidArgument, "out of device memory in ", expr, " (", cudaGetErrorName(err), ": ",
              cudaGetErrorString(err), ") at ", where);
  }
  KILN_FAIL(kInternal, "CUDA call ", expr, " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err), " at ",
            where);
}

const DeviceInfo& current_device() {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<DeviceInfo>> cache;  // entries are never removed
  int index = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&index));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(index);
  if (it != cache.end()) return *it->second;
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  auto info = std::make_unique<DeviceInfo>();
  info->index = index;
  info->arch = prop.major * 10 + prop.minor;
  info->sm_count = prop.multiProcessorCount;
  info->l2_bytes = size_t(prop.l2CacheSize);
  info->shared_per_block_optin = prop.sharedMemPerBlockOptin;
  info->name = prop.name;
  const DeviceInfo& ref = *info;
  cache.emplace(index, std::move(info));
  return ref;
}

namespace {

bool on_host(const void* p) {
  if (!p) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;  // unknown to CUDA: pageable host memory
  }
  return a.type == cudaMemoryTypeHost || a.type == cudaMemoryTypeUnregistered;
}

void add_host_dependencies(cudaGraph_t graph, std::string& out) {
  size_t n = 0;
  KILN_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) KILN_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  auto add = [&](const char* what) { out += (out.empty() ? "" : ", ") + std::string(what); };
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    KILN_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type == cudaGraphNodeTypeGraph) {
      cudaGraph_t child = nullptr;
      KILN_CUDA_CHECK(cudaGraphChildGraphNodeGetGraph(node, &child));
      add_host_dependencies(child, out);
    } else if (type == cudaGraphNodeTypeHost) {
      add("a host callback");
    } else if (type == cudaGraphNodeTypeMemcpy) {
      cudaMemcpy3DParms p{};
      if (cudaGraphMemcpyNodeGetParams(node, &p) != cudaSuccess) {  // not described as 3D: nothing to learn
        (void)cudaGetLastError();
        continue;
      }
      if (!p.srcArray && on_host(p.srcPtr.ptr)) add("a copy from host memory");
      else if (!p.dstArray && on_host(p.dstPtr.ptr)) add("a copy to host memory");
    }
  }
}

}  // namespace

std::string graph_host_dependencies(cudaGraph_t graph) {
  std::string out;
  add_host_dependencies(graph, out);
  return out;
}

namespace {

struct Edges {
  std::vector<cudaGraphNode_t> from, to;
  std::vector<cudaGraphEdgeData> data;
  bool full(size_t i) const { return data[i].type == cudaGraphDependencyTypeDefault && data[i].from_port == 0; }
};

Edges edges_of(cudaGraph_t graph) {
  size_t ne = 0;
  KILN_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &ne));
  Edges e{std::vector<cudaGraphNode_t>(ne), std::vector<cudaGraphNode_t>(ne), std::vector<cudaGraphEdgeData>(ne)};
  if (ne) KILN_CUDA_CHECK(cudaGraphGetEdges(graph, e.from.data(), e.to.data(), e.data.data(), &ne));
  return e;
}

// Makes every programmatic edge of `graph` a full one.
void make_edges_full(cudaGraph_t graph) {
  Edges e = edges_of(graph);
  for (size_t i = 0; i < e.data.size(); ++i) {
    if (e.full(i)) continue;
    KILN_CUDA_CHECK(cudaGraphRemoveDependencies(graph, &e.from[i], &e.to[i], &e.data[i], 1));
    cudaGraphEdgeData plain{};
    KILN_CUDA_CHECK(cudaGraphAddDependencies(graph, &e.from[i], &e.to[i], &plain, 1));
  }
}

// What `launches` enqueues on `stream`, recorded as it is (thread-local capture mode).
GraphPtr record_as_is(cudaStream_t stream, const std::function<void(cudaStream_t)>& launches) {
  KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    launches(stream);
  } catch (...) {
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  KILN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  return GraphPtr(graph);
}

// The nodes next to `node` on one side: cudaGraphNodeGetDependencies (in front of it) or
// cudaGraphNodeGetDependentNodes (after it). Only for a graph whose edges are all full.
template <typename Query>
std::vector<cudaGraphNode_t> neighbours(cudaGraphNode_t node, Query query) {
  size_t n = 0;
  KILN_CUDA_CHECK(query(node, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> out(n);
  if (n) KILN_CUDA_CHECK(query(node, out.data(), nullptr, &n));
  return out;
}

}  // namespace

cudaKernel_t fill_kernel() {
  return Module::support_kernel(std::string(embedded_source("support_fill.cuh")), "kiln_fill", "the graph fill kernel");
}

void small_memsets_as_kernels(cudaGraph_t graph) {
  size_t n = 0;
  KILN_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) KILN_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    KILN_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams m{};
    KILN_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &m));
    unsigned long long width = m.width, count = m.width * m.height, pitch = m.pitch;
    if (count == 0 || count * m.elementSize > kMaxFillBytes) continue;
    unsigned char* dst = static_cast<unsigned char*>(m.dst);
    unsigned value = m.value, elem = m.elementSize;
    void* args[] = {&dst, &pitch, &value, &elem, &width, &count};
    cudaKernelNodeParams k{};
    k.func = reinterpret_cast<void*>(fill_kernel());
    k.blockDim = dim3(256);
    k.gridDim = dim3(unsigned((count + 255) / 256));
    k.kernelParams = args;
    const std::vector<cudaGraphNode_t> before = neighbours(node, cudaGraphNodeGetDependencies);
    const std::vector<cudaGraphNode_t> after = neighbours(node, cudaGraphNodeGetDependentNodes);
    cudaGraphNode_t fill = nullptr;
    KILN_CUDA_CHECK(cudaGraphAddKernelNode(&fill, graph, before.data(), before.size(), &k));
    for (cudaGraphNode_t next : after) KILN_CUDA_CHECK(cudaGraphAddDependencies(graph, &fill, &next, nullptr, 1));
    KILN_CUDA_CHECK(cudaGraphDestroyNode(node));
  }
}

GraphPtr record_graph(cudaStream_t stream, const std::function<void(cudaStream_t)>& launches) {
  // No build on another thread synchronizes the device while this records (starts_early's probe
  // records without the turn: a probe that fails keeps the fence, nothing else).
  const DeviceTurn turn;
  GraphPtr graph = record_as_is(stream, launches);
  make_edges_full(graph.get());
  small_memsets_as_kernels(graph.get());
  return graph;
}

bool starts_early(const std::function<void(cudaStream_t)>& launches) {
  cudaStream_t s = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const std::unique_ptr<CUstream_st, cudaError_t (*)(cudaStream_t)> owned(s, cudaStreamDestroy);
  const GraphPtr graph = record_as_is(s, launches);
  const Edges e = edges_of(graph.get());
  for (size_t i = 0; i < e.data.size(); ++i)
    if (!e.full(i)) return true;
  return false;
}

void dump_graph_if_asked(cudaGraph_t graph) {
  const char* dir = std::getenv("KILN_CUDA_GRAPH_DUMP");
  if (!dir || !*dir) return;
  static std::atomic<int> serial{0};
  const std::string path = std::string(dir) + "/engine-" + std::to_string(serial++) + ".dot";
  (void)cudaGraphDebugDotPrint(graph, path.c_str(), cudaGraphDebugDotFlagsVerbose);
  (void)cudaGetLastError();
}

}  // namespace kiln::cuda
