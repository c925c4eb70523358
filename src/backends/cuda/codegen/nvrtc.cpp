// NVRTC compilation of generated kernels, loading of their cubins, launching, and the saved
// state of a generated kernel.
//
// compile_to_cubin needs only NVRTC (no GPU), so tests compile every generated source on a
// build machine. Its cache is keyed by (arch, source): the many nodes that share one source
// (same op chain and dtypes; sizes are kernel arguments) compile once per process, even when
// a build's workers reach them at once.
//
// KILN_CUDA_NO_COMPILE=1 in the environment makes every compile fail (kInternal), and cuDNN's
// runtime compilation too (make_plan, cudnn_graph.h), so a test or a deployment can check that
// loading an engine file compiles nothing.
//
// The state format (pack_state) is: "KCS1" magic, u32 version, u64 cubin size, cubin,
// u64 params size, params, u32 FNV-1a checksum of everything before it; all little-endian.
#include <nvrtc.h>

#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "kiln/errors.h"
#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/tuning/build_turn.h"

namespace kiln::cuda {
namespace {

#define KILN_NVRTC_CHECK(expr)                                                                                      \
  do {                                                                                                              \
    nvrtcResult kiln_rc_ = (expr);                                                                                  \
    if (kiln_rc_ != NVRTC_SUCCESS)                                                                                  \
      KILN_FAIL(kInternal, "NVRTC call ", #expr, " failed: ", nvrtcGetErrorString(kiln_rc_), " at ", __FILE__, ":", \
                __LINE__);                                                                                          \
  } while (0)

// Destroys an NVRTC program on every path out of compile_uncached.
struct ProgramGuard {
  nvrtcProgram prog = nullptr;
  ~ProgramGuard() {
    if (prog) nvrtcDestroyProgram(&prog);
  }
};

// NVRTC dlopens libnvrtc-builtins.so.<major>.<minor> by name at its first compile, which
// fails when libnvrtc was found through a RUNPATH (as with the pip wheels) rather than the
// loader's search path. Loading it once by full path from libnvrtc's own folder first makes
// that later lookup find the loaded copy; if this fails, NVRTC's own error explains.
void preload_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    Dl_info info{};
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return;
    if (dladdr(reinterpret_cast<void*>(&nvrtcVersion), &info) == 0 || info.dli_fname == nullptr) return;
    std::string dir = info.dli_fname;
    const size_t slash = dir.rfind('/');
    if (slash == std::string::npos) return;
    dir.resize(slash + 1);
    const std::string name = "libnvrtc-builtins.so." + std::to_string(major) + "." + std::to_string(minor);
    if (dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD)) return;  // already there
    (void)dlopen((dir + name).c_str(), RTLD_NOW | RTLD_GLOBAL);  // kept loaded for the process
  });
}

Bytes compile_uncached(const std::string& source, const std::string& what, int arch) {
  preload_builtins();
  ProgramGuard guard;
  KILN_NVRTC_CHECK(nvrtcCreateProgram(&guard.prog, source.c_str(), "kiln_generated.cu", 0, nullptr, nullptr));
  const std::string arch_opt = "-arch=sm_" + std::to_string(arch);
  // Fast math stays off (its default): results must match the CPU backend's within tolerance.
  const char* opts[] = {arch_opt.c_str(), "-std=c++17", "-default-device"};
  const nvrtcResult rc = nvrtcCompileProgram(guard.prog, 3, opts);
  if (rc != NVRTC_SUCCESS) {
    size_t log_size = 0;
    std::string log;
    if (nvrtcGetProgramLogSize(guard.prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
      log.resize(log_size);
      if (nvrtcGetProgramLog(guard.prog, log.data()) != NVRTC_SUCCESS) log.clear();
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    }
    KILN_FAIL(kInternal, "NVRTC could not compile the generated kernel for ", what, " (sm_", arch,
              "): ", nvrtcGetErrorString(rc), "\n", log);
  }
  size_t size = 0;
  KILN_NVRTC_CHECK(nvrtcGetCUBINSize(guard.prog, &size));
  KILN_CHECK(size > 0, kInternal, "NVRTC produced an empty cubin for ", what);
  Bytes cubin(size);
  KILN_NVRTC_CHECK(nvrtcGetCUBIN(guard.prog, reinterpret_cast<char*>(cubin.data())));
  return cubin;
}

constexpr char kMagic[4] = {'K', 'C', 'S', '1'};
constexpr uint32_t kStateVersion = 1;

uint32_t fnv1a(const uint8_t* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

void put_u32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(uint8_t(v >> (8 * i)));
}
void put_u64(Bytes& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(uint8_t(v >> (8 * i)));
}

// Bounds-checked reads of the state; every failure is kCorrupted.
struct Reader {
  const Bytes& b;
  size_t pos = 0;
  uint64_t get(int bytes) {
    KILN_CHECK(b.size() - pos >= size_t(bytes), kCorrupted, "generated kernel state is truncated at byte ", pos);
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t(b[pos + i]) << (8 * i);
    pos += size_t(bytes);
    return v;
  }
  Bytes blob() {
    const uint64_t n = get(8);
    KILN_CHECK(n <= b.size() - pos, kCorrupted, "generated kernel state: a ", n, "-byte field runs past the end (",
               b.size() - pos, " bytes left)");
    Bytes out(b.begin() + std::ptrdiff_t(pos), b.begin() + std::ptrdiff_t(pos + n));
    pos += size_t(n);
    return out;
  }
};

// compile_to_cubin without the KILN_CUDA_NO_COMPILE check: cached in-process by (arch, source).
// A source that another thread is compiling is waited for, not compiled twice (a build's
// workers reach identical nodes at once, build_turn.h); unrelated sources compile in parallel.
// Compiling and waiting are host work, done off the build turn. A failed compile leaves no
// entry, so a later request tries again.
Bytes compile_cached(const std::string& source, const std::string& what, int arch) {
  static std::mutex mu;
  static std::map<std::pair<int, std::string>, std::shared_future<Bytes>> cache;
  auto key = std::make_pair(arch, source);
  std::promise<Bytes> mine;
  std::shared_future<Bytes> result;
  bool compile = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    const auto it = cache.find(key);
    if (it == cache.end()) {
      result = mine.get_future().share();
      cache.emplace(key, result);
      compile = true;
    } else {
      result = it->second;
    }
  }
  if (!compile && result.wait_for(std::chrono::seconds(0)) == std::future_status::ready) return result.get();
  const OffTurn off;
  if (!compile) return result.get();
  try {
    mine.set_value(compile_uncached(source, what, arch));
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu);
      cache.erase(key);
    }
    mine.set_exception(std::current_exception());
  }
  return result.get();
}

}  // namespace

bool compiling_forbidden() {
  const char* forbid = std::getenv("KILN_CUDA_NO_COMPILE");
  return forbid != nullptr && forbid[0] != '\0' && std::string(forbid) != "0";
}

Bytes compile_to_cubin(const std::string& source, const std::string& what, int arch) {
  KILN_CHECK(!compiling_forbidden(), kInternal, "KILN_CUDA_NO_COMPILE is set, yet the kernel for ", what,
             " needs compiling");
  return compile_cached(source, what, arch);
}

cudaKernel_t Module::support_kernel(const std::string& source, const char* name, const std::string& what) {
  struct Loaded {
    std::shared_ptr<const Module> module;
    cudaKernel_t kernel;
  };
  static std::mutex mu;
  static std::map<std::tuple<int, std::string, std::string>, Loaded> kernels;  // never removed
  auto key = std::make_tuple(current_device().arch, source, std::string(name));
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = kernels.find(key); it != kernels.end()) return it->second.kernel;
  }
  std::shared_ptr<const Module> module = load(compile_cached(source, what, std::get<0>(key)));
  const cudaKernel_t kernel = module->kernel(name);
  std::lock_guard<std::mutex> lock(mu);
  return kernels.emplace(std::move(key), Loaded{std::move(module), kernel}).first->second.kernel;
}

std::shared_ptr<const Module> Module::compile(const std::string& source, const std::string& what) {
  return load(compile_to_cubin(source, what, current_device().arch));
}

Module::Module(Bytes cubin) : cubin_(std::move(cubin)) {}

std::shared_ptr<const Module> Module::load(Bytes cubin) {
  KILN_CHECK(!cubin.empty(), kCorrupted, "generated kernel state holds an empty cubin");
  // Nodes of one kind share a source and so a cubin (fifty layer norms, one kernel): they
  // share the loaded module too, which saves the load and the device memory of each copy.
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const Module>> loaded;  // by the cubin's bytes
  std::string key(cubin.begin(), cubin.end());
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = loaded.find(key); it != loaded.end()) {
    if (auto shared = it->second.lock()) return shared;
    loaded.erase(it);
  }
  std::shared_ptr<Module> m(new Module(std::move(cubin)));
  const cudaError_t err = cudaLibraryLoadData(&m->library_, m->cubin_.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (err == cudaErrorInvalidKernelImage || err == cudaErrorInvalidSource || err == cudaErrorInvalidPtx ||
      err == cudaErrorNoKernelImageForDevice || err == cudaErrorUnsupportedPtxVersion || err == cudaErrorInvalidValue) {
    (void)cudaGetLastError();
    m->library_ = nullptr;
    KILN_FAIL(kCorrupted, "the CUDA driver rejected a stored kernel image (", m->cubin_.size(),
              " bytes): ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  }
  if (err != cudaSuccess) {
    m->library_ = nullptr;
    fail_cuda(err, "cudaLibraryLoadData", __FILE__, __LINE__);
  }
  loaded.emplace(std::move(key), m);
  return m;
}

Module::~Module() {
  // Errors are ignored: at process exit the runtime may already be torn down.
  if (library_) (void)cudaLibraryUnload(library_);
}

cudaKernel_t Module::kernel(const char* name) const {
  cudaKernel_t k = nullptr;
  const cudaError_t err = cudaLibraryGetKernel(&k, library_, name);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    KILN_FAIL(kInternal, "generated module has no kernel '", name, "': ", cudaGetErrorName(err), ": ",
              cudaGetErrorString(err));
  }
  return k;
}

void launch(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, size_t shared_bytes, cudaStream_t stream) {
  KILN_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, args, shared_bytes, stream));
  KILN_CUDA_CHECK_LAUNCH();
}

Bytes pack_state(const Bytes& cubin, const Bytes& params) {
  Bytes out(kMagic, kMagic + 4);
  out.reserve(4 + 4 + 8 + cubin.size() + 8 + params.size() + 4);
  put_u32(out, kStateVersion);
  put_u64(out, cubin.size());
  out.insert(out.end(), cubin.begin(), cubin.end());
  put_u64(out, params.size());
  out.insert(out.end(), params.begin(), params.end());
  put_u32(out, fnv1a(out.data(), out.size()));
  return out;
}

CompiledState unpack_state(const Bytes& state) {
  KILN_CHECK(state.size() >= 4 + 4 + 8 + 8 + 4 && std::memcmp(state.data(), kMagic, 4) == 0, kCorrupted,
             "generated kernel state is malformed (", state.size(), " bytes, bad header)");
  const size_t body = state.size() - 4;
  uint32_t stored = 0;
  for (int i = 0; i < 4; ++i) stored |= uint32_t(state[body + size_t(i)]) << (8 * i);
  KILN_CHECK(stored == fnv1a(state.data(), body), kCorrupted, "generated kernel state fails its checksum");
  Reader r{state, 4};
  const uint64_t version = r.get(4);
  KILN_CHECK(version == kStateVersion, kCorrupted, "generated kernel state has version ", version, ", expected ",
             kStateVersion);
  CompiledState out;
  out.cubin = r.blob();
  out.params = r.blob();
  KILN_CHECK(r.pos == body, kCorrupted, "generated kernel state has ", body - r.pos, " unexpected trailing bytes");
  return out;
}

}  // namespace kiln::cuda
