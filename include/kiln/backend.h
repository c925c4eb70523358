// The interface every backend (CPU, CUDA) implements. The builder asks a backend whether it
// supports a node and for a Kernel per node; the runtime asks it for memory and copies.
//
// Kernels are made once per engine (at build or load) with every shape known, so that
// running one only needs buffer addresses: no allocation and no shape arithmetic on the hot
// path. A Kernel's run() is const and may be called from several threads at once (one per
// ExecutionContext); any scratch it needs comes from the caller's workspace.
//
// Kernel lifecycle: at build, make_kernel(node, graph, options, nullptr) chooses an
// implementation (timing candidates where the backend has several: a tactic) and may generate
// and compile code; state() then returns what is needed to make the same kernel again, which
// the engine file stores. At load, make_kernel(..., &state) rebuilds it from those bytes
// without timing or compiling anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kiln/build_policy.h"
#include "kiln/ir.h"

namespace kiln {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  std::string to_string() const;            // "cpu", "cuda:0"
  static Device parse(const std::string& s);  // throws kInvalidArgument
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
};

// Per call state handed to kernels.
struct RunContext {
  void* stream = nullptr;      // cudaStream_t for CUDA; unused on CPU
  void* workspace = nullptr;   // at least Kernel::workspace_size() bytes, aligned
  size_t workspace_size = 0;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  // inputs[i] is null for an absent optional input. Constants arrive as device pointers too.
  virtual void run(const void* const* inputs, void* const* outputs, const RunContext& ctx) const = 0;
  virtual size_t workspace_size() const { return 0; }
  // A short description of the implementation chosen (tactic), for build logs.
  virtual std::string describe() const { return {}; }
  // The tactic and generated code that make_kernel needs to remake this kernel (see above).
  virtual Bytes state() const { return {}; }
  // Whether make_kernel read the values of constant inputs (packed weights, scalars baked into
  // generated code), so that a refit that rewrites one must make the kernel again. Kernels that
  // only take constants by pointer say false; refit then leaves them as they are.
  virtual bool bakes_constants() const { return true; }
  // Whether output 0 may be written over the bytes of inputs[input] (the memory planner then
  // places it there when nothing reads that input later): true only where the kernel's result is
  // the same either way, e.g. one that reads each element of that input before it writes the
  // output element at the same position and no other. Asked when an engine is made, and only for
  // an input the planner could place the output on (memory_plan.cpp's in-place rule).
  virtual bool writes_over_input(size_t input) const {
    (void)input;
    return false;
  }
};

// A recorded sequence of kernel launches that replays as one unit (a CUDA graph).
class CapturedGraph {
 public:
  virtual ~CapturedGraph() = default;
  virtual void replay(void* stream) = 0;
};

// Host data a backend derives from a constant's bytes when it makes kernels (the CPU backend's
// weights packed into its GEMM's panels), shared by an engine and its instances (Engine::instance)
// so that an instance at other sizes derives nothing its engine's kernels already hold. An entry
// lasts while its constant's buffer and some kernel holding the data live; a refit forgets them
// all (the bytes change in place). Thread-safe.
class DerivedConstants {
 public:
  using Make = std::function<std::shared_ptr<const void>()>;
  // The data `what` (naming the derivation and all it depends on besides the bytes) derived from
  // `source`'s bytes: the one made before where it is still held, else make()'s.
  std::shared_ptr<const void> get(const std::shared_ptr<const HostBuffer>& source, const std::string& what,
                                  const Make& make);
  void clear();

 private:
  struct Entry {
    std::weak_ptr<const HostBuffer> source;
    std::weak_ptr<const void> data;
  };
  std::mutex mu_;
  std::map<std::pair<const HostBuffer*, std::string>, Entry> entries_;
};

// What a build hands every make_kernel call (BuilderConfig's optimization level, workspace limit
// and policy); an engine file keeps them, so that a load or a refit makes kernels with the same.
struct KernelOptions {
  int optimization_level = 3;
  // Make no kernel that compiles library code when it is made (cuDNN's runtime-compiled engines
  // are passed over where another serves): an engine instance that serves its first call at once
  // (Engine::instance, kiln/instances.py). Not saved in engine files: a load compiles nothing anyway.
  bool precompiled_only = false;
  // Made in the background while the process serves calls (an instance replacing an untimed one):
  // its device work yields to the calls' (the CUDA build turn). Not saved; changes no kernel.
  bool background = false;
  size_t workspace_limit = size_t(1) << 30;
  BuildPolicy policy;
  // The engine's DerivedConstants (Engine sets it; null: each kernel derives its own). Not saved.
  std::shared_ptr<DerivedConstants> derived;
  // How many candidates tactic searches try: the budget of optimization_level (kiln/build_policy.h).
  TacticBudget budget() const { return tactic_budget(optimization_level); }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;           // "cpu", "cuda"
  virtual Device device() const = 0;
  virtual std::string device_name() const = 0;    // what an engine file records, e.g. "cpu"
  // The answer to "can you run this node?"; `why` receives the reason when the answer is no.
  virtual bool supports(const Node& node, const Graph& graph, std::string* why = nullptr) const = 0;
  // `state` is null when building (the backend chooses), or the Kernel::state() saved with the
  // engine when loading one; a state the backend cannot read is kCorrupted.
  virtual std::unique_ptr<Kernel> make_kernel(const Node& node, const Graph& graph, const KernelOptions& options,
                                              const Bytes* state = nullptr) = 0;
  // make_kernel for every node of `graph`, in node order: a build when `states` is null, else a
  // load (one state per node). ms[i] receives the milliseconds node i took. The default makes
  // them one after the other; a backend whose kernels spend their build time compiling may make
  // several at once (CUDA: build_turn.h). Throws the error of the first node, in node order,
  // that failed.
  virtual std::vector<std::unique_ptr<Kernel>> make_kernels(const Graph& graph, const KernelOptions& options,
                                                            const std::vector<Bytes>* states, std::vector<double>* ms);
  // Device memory; the deleter frees it. alignment() bytes aligned.
  virtual std::shared_ptr<void> allocate(size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t bytes, void* stream) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes, void* stream) = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes, void* stream) = 0;
  virtual void synchronize(void* stream) = 0;
  // Copies every host buffer to its device address and returns once all have landed (an
  // engine's constants at load and refit: hundreds of MB). The default copies one at a time.
  struct HostCopy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  virtual void upload(const std::vector<HostCopy>& copies) {
    for (const HostCopy& c : copies) copy_from_host(c.dst, c.src, c.bytes, nullptr);
    synchronize(nullptr);
  }
  // The word checksum (below) of buffers in this backend's memory laid end to end, read after
  // the work queued on `stream` (null: the legacy default stream). The engine cache compares
  // model weights with it where they live; the default reads host memory (CPU) in place and
  // copies other memory to the host first.
  struct Span {
    const void* data;
    size_t bytes;
  };
  virtual uint64_t checksum(const std::vector<Span>& buffers, void* stream);
  // Records what `launches` enqueues on `stream` into a graph that replays it. Null where the
  // backend has no such thing (CPU), or where the recording would not replay correctly (`why`
  // then says why); in either case nothing was run.
  virtual std::unique_ptr<CapturedGraph> capture(const std::function<void(void* stream)>& launches, void* stream,
                                                 std::string* why = nullptr) {
    (void)launches, (void)stream, (void)why;
    return nullptr;
  }
  virtual size_t alignment() const { return 64; }
  // Starts the one-time setup of the libraries this backend's kernels call (CUDA: cuBLASLt's
  // handle and first algorithm queries, which would otherwise fall on a process's first GEMM;
  // also the upload lanes and the checksum kernel) on a thread of its own, so that it overlaps
  // with what the caller does next (reading an engine file, the build passes). The future says
  // what was set up and how long it took (for the load log); its destructor waits for the
  // thread, so none outlives the caller's scope. The
  // setup's own errors are dropped: the kernel that needs the library reports them. Invalid
  // (nothing to do) by default and after the first call.
  virtual std::future<std::string> warm_up() { return {}; }
  // Called once at the end of every build: a backend that keeps build-time caches across
  // processes (CUDA: the timing cache) writes them here.
  virtual void build_finished() {}
};

// The word checksum of `bytes` bytes at host address `data`, padded with zeros to whole 8-byte
// words, whose first word has index `first_word` in the stream being summed: each little-endian
// word w at index i adds m ^ (m >> 29), where m = (w ^ i * 0x5851F42D4C957F2D) * 0x2545F4914F6CDD1D,
// to `sum` (all modulo 2^64). Any changed or moved word changes it: the index is mixed in before
// the multiplication, and words are summed, so a device computes it in any order.
uint64_t word_checksum(const void* data, size_t bytes, uint64_t first_word, uint64_t sum);
constexpr uint64_t kWordMix1 = 0x5851F42D4C957F2DULL, kWordMix2 = 0x2545F4914F6CDD1DULL;

// Where the backends that time tactics keep their timing cache file (the CUDA backend; nothing
// otherwise). $KILN_TIMING_CACHE, when set, wins over it.
void set_timing_cache_path(const std::string& path);

// The backend for a device; throws kUnsupported when Kiln was built without it or no such
// device is present.
Backend& get_backend(const Device& device);
bool backend_available(DeviceType type);
// Backend::supports of the backend for `type`, answered without a device present (the
// partitioner asks it while a build for a GPU is planned anywhere, a dry run included).
bool device_supports(DeviceType type, const Node& node, const Graph& graph, std::string* why = nullptr);

// A shared library a backend was built against: the version its headers declared, the version
// of the copy loaded in this process, and that copy's file.
struct LibraryVersion {
  std::string name;
  int built = 0;
  int loaded = 0;
  std::string file;
};
// The libraries of every backend in this build (none for the CPU backend). Loads nothing new.
std::vector<LibraryVersion> backend_library_versions();

}  // namespace kiln
