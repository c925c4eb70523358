// Shared machinery of the generated-kernel families (reduce, softmax, norm, pool, shape,
// gather, generator): a kernel is a *plan* (a list of launches of one NVRTC module) that is
// decided entirely at make time from the node's shapes, plus the module's source.
//
// A Launch names an extern "C" kernel of the module, its grid / block / dynamic shared
// memory, and its arguments: an input or output buffer (plus a byte offset, so concat can
// write into the middle of its output), the workspace, or a fixed value (an integer, a float
// or a by-value struct of sizes and strides) whose bytes are stored in the plan. run() only
// assembles the argument array and launches on the caller's stream, so it is capturable into
// a CUDA graph. The plan serializes into the params of pack_state(cubin, params): loading an
// engine rebuilds the kernel from those bytes without generating or compiling anything.
//
// generate_<family>(node, graph) returns the source and the plan without touching the GPU,
// which is what the codegen tests compile for sm_90 on a machine with no device.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/backend.h"
#include "kiln/errors.h"
#include "kiln/ir.h"

namespace kiln::cuda::gen {

constexpr int kMaxRank = 8;            // dims of a strided walk after collapsing
constexpr uint32_t kMaxBlocks = 8192;  // grid-stride kernels launch at most this many blocks
// The multiprocessors of a large GPU (H100 SXM). Work splits that must fill the GPU compare
// against it instead of the device's own count, so a generated source is the same on every GPU.
constexpr int64_t kLargeGpuSms = 132;

enum class ArgKind : uint8_t { kInput = 0, kOutput = 1, kWorkspace = 2, kValue = 3 };

struct Arg {
  ArgKind kind = ArgKind::kValue;
  int32_t index = 0;        // which input / output
  int64_t offset = 0;       // bytes added to the buffer's address
  std::vector<uint8_t> value;  // kValue: the parameter's bytes (its exact C type in the source)
};

struct Launch {
  std::string kernel;
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t shared = 0;
  std::vector<Arg> args;
  // Vectorized launches: every buffer argument must be aligned to `align` bytes; when one is
  // not (a caller's buffer at an odd offset), run() launches alt[0] (the same work with
  // narrower accesses) instead.
  uint32_t align = 0;
  std::vector<Launch> alt;

  Launch() = default;
  Launch(std::string name, uint32_t gx, uint32_t bx, uint32_t gy = 1, uint32_t by = 1) : kernel(std::move(name)) {
    grid[0] = gx, grid[1] = gy, block[0] = bx, block[1] = by;
  }
  Launch& in(int i, int64_t offset = 0) { return ptr(ArgKind::kInput, i, offset); }
  Launch& out(int i, int64_t offset = 0) { return ptr(ArgKind::kOutput, i, offset); }
  Launch& ws(int64_t offset = 0) { return ptr(ArgKind::kWorkspace, 0, offset); }
  Launch& null() { return val<const void*>(nullptr); }  // an absent optional buffer
  // Input i, or a null pointer when the node's input i is absent.
  Launch& opt_in(const Node& n, size_t i) {
    return i < n.inputs.size() && n.inputs[i] != kNoValue ? in(int(i)) : null();
  }
  // A by-value parameter: T must have exactly the layout of the source's parameter type.
  template <typename T>
  Launch& val(const T& v) {
    Arg a;
    a.value.resize(sizeof(T));
    std::memcpy(a.value.data(), &v, sizeof(T));
    args.push_back(std::move(a));
    return *this;
  }
  Launch& i64(int64_t v) { return val<long long>(static_cast<long long>(v)); }
  Launch& f32(double v) { return val<float>(static_cast<float>(v)); }
  Launch& f64(double v) { return val<double>(v); }

 private:
  Launch& ptr(ArgKind k, int i, int64_t offset) {
    Arg a;
    a.kind = k, a.index = i, a.offset = offset;
    args.push_back(std::move(a));
    return *this;
  }
};

struct Plan {
  std::vector<Launch> launches;
  uint64_t workspace = 0;
  std::string describe;
};

// What a family's generator returns: the module source (empty when the plan has no launch,
// e.g. an empty tensor) and the plan.
struct Generated {
  std::string source;
  Plan plan;
};

// Makes `l` vectorized: it needs `align`-byte aligned buffers, else `fallback` runs.
inline void with_fallback(Launch& l, uint32_t align, Launch fallback) {
  if (align <= 1) return;
  l.align = align;
  l.alt.clear();
  l.alt.push_back(std::move(fallback));
}

// By-value structs of sizes and strides (the source declares the same layout: kDimsDecl).
struct Dims {
  long long ext[kMaxRank];
  long long ist[kMaxRank];  // input element (or word) strides
  long long ost[kMaxRank];  // output element (or word) strides
};
inline const char* kDimsDecl = "struct Dims { long long ext[8]; long long ist[8]; long long ost[8]; };\n";

Bytes serialize(const Plan& p);
Plan deserialize(const Bytes& b);  // kCorrupted when malformed

// The kernel: compiles `g.source` (state null) or loads the state's cubin (state given, no
// compile), resolves every launch's kernel, and launches them in order on run().
std::unique_ptr<Kernel> build(const Generated& g, const std::string& what, const Bytes* state);

// compile_to_cubin (nvrtc.h) for tests, which then need no CUDA header: needs no GPU.
Bytes compile_for_arch(const std::string& source, const std::string& what, int arch);

// "layer_norm node 'ln_3'" for messages.
std::string what_of(const Node& n);

// ---- source helpers ------------------------------------------------------------------
// Device code lives in codegen/cuh/ (read through embedded.h): a generator picks a file and
// sets its parameters as macros before appending it. define() writes one such macro,
// "#define <name> <value>\n" (a bool as 1 or 0).
std::string define(const std::string& name, const std::string& value);
std::string define(const std::string& name, int64_t value);
// `typedef <storage> T_<alias>;` plus `ld_<alias>(T) -> C` and `st_<alias>(C) -> T` where C is
// the compute type (float for f32/f16/bf16, double for f64, long long for integers and bool).
std::string type_defs(const std::string& alias, DType t);
// The compute type type_defs uses: "float", "double" or "long long".
const char* compute_of(DType t);
// The unsigned word type of `bytes` bytes (1, 2, 4, 8 or 16: uint4).
const char* word_type(int bytes);
// prelude() plus cuh/plan_helpers.cuh: KG_INF, kg_max / kg_min and the warp / block reductions
// (kg_warp_sum, kg_block_sum, ...).
std::string source_head();
// The largest word (16, 8, 4, 2 or esz bytes) dividing every given byte count.
int word_bytes(int esz, std::initializer_list<int64_t> byte_counts);
// Replaces every occurrence of `from` in s by `to` (fills in generated-code templates).
std::string replace_all(std::string s, const std::string& from, const std::string& to);
// How `lanes` threads hold a row of n elements of esz bytes in registers: vec elements per load
// (the widest of at most 16 bytes dividing n) and per_lane elements each, the fewest multiple
// of vec that covers the row (a 768-element f16 row over a warp: 3 loads of 8, 24 values per
// lane, where rounding up to a power of two would hold 32).
struct RowSplit {
  int per_lane = 1, vec = 1;
};
RowSplit split_row(int64_t n, int lanes, int esz);
// The lanes of a warp that hold one row of n elements loaded vec at a time: 32, or for a row of
// at most 16 words the power of two that covers them, several rows a warp (a head dim of 32
// halves is 4 words: 8 rows a warp instead of 4 busy lanes in 32).
int row_lanes(int64_t n, int vec);
// How a plan's description names `lanes` lanes per row: "warp", "1 lane", "8 lanes".
std::string lanes_name(int lanes);
// Grid-stride block count for n work items of `per_block` each.
uint32_t blocks_for(int64_t n, int64_t per_block);

// ---- what a family's generator can serve ---------------------------------------------
// The types Attrs' getters read: get_int also reads a bool, get_float an int.
enum class AttrType { kInt, kFloat, kBool, kInts };
// Why attribute `key` of n cannot be read as `type` (absent while `required`, or of another
// type), or nullopt when it can.
std::optional<std::string> attr_problem(const Node& n, const std::string& key, AttrType type, bool required);

// Why generate_<family> cannot make a kernel for n, or nullopt when it can: the node's op,
// dtypes, ranks, attributes and limits, checked without generating anything. supports_<family>
// answers with it; generate_<family> fails with kUnsupported and the same reason.
std::optional<std::string> why_not_reduce(const Node& n, const Graph& g);
std::optional<std::string> why_not_softmax(const Node& n, const Graph& g);
std::optional<std::string> why_not_norm(const Node& n, const Graph& g);
std::optional<std::string> why_not_pool(const Node& n, const Graph& g);

// supports_<family>'s answer from its family's check: true when there is no reason (or error),
// else false with the reason (the error's message) in `why`.
inline bool supported(const std::optional<std::string>& no, std::string* why) {
  if (no && why) *why = *no;
  return !no;
}
inline bool supported(const std::optional<Error>& error, std::string* why) {
  if (error && why) *why = error->what();
  return !error;
}

// Family generators (for tests; make_<family>_kernel wraps them with build()).
Generated generate_reduce(const Node& n, const Graph& g);
Generated generate_softmax(const Node& n, const Graph& g);
Generated generate_norm(const Node& n, const Graph& g);
Generated generate_pool(const Node& n, const Graph& g);
Generated generate_shape(const Node& n, const Graph& g);
Generated generate_gather(const Node& n, const Graph& g);
Generated generate_generator(const Node& n, const Graph& g);

// ---- few long rows: splitting a row across blocks ---------------------------------------
// The norm, reduce and softmax generators give each row (a group of group_norm, a reduced
// output, a softmax row) one block. When the rows are few and long that leaves most
// multiprocessors idle, so split_rows cuts each row into chunks of one block each: a first
// kernel writes each chunk's statistics to the workspace (Plan::workspace, which the engine
// sizes and allocates before it runs, so nothing is allocated at run time), a second combines
// a row's chunks and writes the row.
//
// What a generator that splits rows needs of the build: the multiprocessors of the device the
// engine is built for (make_<family>_kernel reads them from the device) and the most
// workspace a kernel may use (KernelOptions::workspace_limit).
struct Target {
  int64_t sms = kLargeGpuSms;
  uint64_t workspace_limit = uint64_t(1) << 30;
};
constexpr int64_t kSplitMinRow = 8192;     // shorter rows keep one block
constexpr int64_t kSplitMinChunk = 2048;   // elements a block of a split row gets at least
constexpr uint32_t kSplitThreads = 256;    // threads of a split row's blocks
// A row of `row_len` elements in `splits` chunks of `chunk` (a multiple of the quantum; the
// last chunk may be shorter, none is empty), whose statistics take `workspace` bytes. splits is
// 1 (chunk row_len, workspace 0) when the row stays on one block.
struct SplitPlan {
  int64_t splits = 1;
  int64_t chunk = 0;
  uint64_t workspace = 0;
  bool split() const { return splits > 1; }
  // " (split: <splits> blocks per <what> of <chunk> elements, <vec>-wide loads)", for a plan's description.
  std::string describe(const char* what, int vec) const;
};
// The rule: split when the rows are fewer than two per multiprocessor (one block each leaves
// multiprocessors idle or unevenly loaded) and each row has at least kSplitMinRow elements;
// then into enough chunks for about four blocks per multiprocessor in all, each of at least
// kSplitMinChunk elements, rounded up to a multiple of `quantum` (the elements of one vector
// load). Each chunk's statistics take stat_bytes; no split when rows * splits * stat_bytes
// (rounded up to 256) is over t.workspace_limit.
SplitPlan split_rows(int64_t rows, int64_t row_len, int64_t quantum, int64_t stat_bytes, const Target& t);

// The family generators for a given target (the overloads above use Target{}: a large GPU).
Generated generate_reduce(const Node& n, const Graph& g, const Target& t);
Generated generate_softmax(const Node& n, const Graph& g, const Target& t);
Generated generate_norm(const Node& n, const Graph& g, const Target& t);

// A fill of `count` elements of `esz` bytes with the bit pattern `bits` (low esz bytes), into
// output `out` at byte offset 0: used by full and by empty reductions. Appends its kernel
// (cuh/plan_fill.cuh) to `source` (once per word size) and its launch to `plan`.
void add_fill(std::string& source, Plan& plan, int out, int64_t count, int esz, uint64_t bits);

}  // namespace kiln::cuda::gen
