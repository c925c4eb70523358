// The plan-driven kernel of the generated families (see plan.h): plan serialization,
// the Kernel that launches a plan, and the source pieces the families share.
//
// Plan bytes: u32 version, u64 workspace, string describe, u32 launch count, then per launch:
// string kernel, 3 x u32 grid, 3 x u32 block, u32 shared, u32 arg count, per arg: u8 kind,
// i32 index, i64 offset, u32 value size, value bytes. Little-endian; every read is bounds
// checked (kCorrupted), since the bytes come from an engine file.
#include <algorithm>
#include <variant>

#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/codegen/prelude.h"
#include "src/backends/cuda/device/cuda_util.h"

namespace kiln::cuda::gen {

namespace {

constexpr uint32_t kPlanVersion = 1;
constexpr size_t kMaxArgs = 32;

struct Writer {
  Bytes out;
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void str(const std::string& s) {
    u32(uint32_t(s.size()));
    raw(s.data(), s.size());
  }
  void raw(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = out.size();
    out.resize(at + n);
    std::memcpy(out.data() + at, p, n);
  }
};

struct Reader {
  const Bytes& in;
  size_t pos = 0;
  void raw(void* p, size_t n) {
    KILN_CHECK(n <= in.size() - pos, kCorrupted, "generated kernel state: plan ends early at byte ", pos);
    std::memcpy(p, in.data() + pos, n);
    pos += n;
  }
  uint32_t u32() {
    uint32_t v;
    raw(&v, 4);
    return v;
  }
  uint64_t u64() {
    uint64_t v;
    raw(&v, 8);
    return v;
  }
  std::string str() {
    const uint32_t n = u32();
    KILN_CHECK(n <= in.size() - pos, kCorrupted, "generated kernel state: string of ", n, " bytes past the end");
    std::string s(reinterpret_cast<const char*>(in.data() + pos), n);
    pos += n;
    return s;
  }
};

// A launch resolved against the module: the kernel handle, and its fallback's.
struct Resolved {
  const Launch* launch;
  cudaKernel_t fn;
  cudaKernel_t alt_fn;
};

// The argument array of one launch, and whether every buffer meets its alignment.
bool assemble(const Launch& l, const void* const* inputs, void* const* outputs, const RunContext& ctx, void** ptrs,
              void** argv) {
  bool aligned = true;
  for (size_t i = 0; i < l.args.size(); ++i) {
    const Arg& a = l.args[i];
    char* base = nullptr;
    switch (a.kind) {
      case ArgKind::kInput: base = static_cast<char*>(const_cast<void*>(inputs[a.index])); break;
      case ArgKind::kOutput: base = static_cast<char*>(outputs[a.index]); break;
      case ArgKind::kWorkspace: base = static_cast<char*>(ctx.workspace); break;
      case ArgKind::kValue: argv[i] = const_cast<uint8_t*>(a.value.data()); continue;
    }
    ptrs[i] = base ? base + a.offset : nullptr;
    argv[i] = &ptrs[i];
    if (l.align > 1 && reinterpret_cast<uintptr_t>(ptrs[i]) % l.align != 0) aligned = false;
  }
  return aligned;
}

class GenKernel final : public Kernel {
 public:
  GenKernel(std::shared_ptr<const Module> module, Plan plan) : module_(std::move(module)), plan_(std::move(plan)) {
    for (const Launch& l : plan_.launches) {
      KILN_CHECK(module_ != nullptr, kCorrupted, "generated kernel state: launches without a module");
      for (const Launch* x : {&l, l.alt.empty() ? nullptr : &l.alt[0]})
        KILN_CHECK(!x || x->args.size() <= kMaxArgs, kCorrupted, "generated kernel state: ", x->args.size(),
                   " arguments");
      resolved_.push_back(
          {&l, module_->kernel(l.kernel.c_str()), l.alt.empty() ? nullptr : module_->kernel(l.alt[0].kernel.c_str())});
    }
  }

  void run(const void* const* inputs, void* const* outputs, const RunContext& ctx) const override {
    cudaStream_t stream = stream_of(ctx);
    void* ptrs[kMaxArgs];
    void* argv[kMaxArgs];
    for (const Resolved& r : resolved_) {
      const Launch* l = r.launch;
      cudaKernel_t fn = r.fn;
      if (!assemble(*l, inputs, outputs, ctx, ptrs, argv)) {
        KILN_CHECK(r.alt_fn != nullptr, kInternal, "generated kernel ", l->kernel,
                   ": misaligned buffer and no fallback");
        l = &l->alt[0];
        fn = r.alt_fn;
        assemble(*l, inputs, outputs, ctx, ptrs, argv);
      }
      launch(fn, dim3(l->grid[0], l->grid[1], l->grid[2]), dim3(l->block[0], l->block[1], l->block[2]), argv, l->shared,
             stream);
    }
  }
  size_t workspace_size() const override { return size_t(plan_.workspace); }
  std::string describe() const override { return plan_.describe; }
  Bytes state() const override { return pack_state(module_ ? module_->cubin() : Bytes{}, serialize(plan_)); }

 private:
  std::shared_ptr<const Module> module_;
  Plan plan_;
  std::vector<Resolved> resolved_;  // points into plan_.launches (never resized after construction)
};

void write_launch(Writer& w, const Launch& l) {
  w.str(l.kernel);
  for (uint32_t v : l.grid) w.u32(v);
  for (uint32_t v : l.block) w.u32(v);
  w.u32(l.shared);
  w.u32(uint32_t(l.args.size()));
  for (const Arg& a : l.args) {
    const uint8_t kind = uint8_t(a.kind);
    w.raw(&kind, 1);
    w.u32(uint32_t(a.index));
    w.u64(uint64_t(a.offset));
    w.u32(uint32_t(a.value.size()));
    w.raw(a.value.data(), a.value.size());
  }
  w.u32(l.align);
  w.u32(uint32_t(l.alt.size()));
  for (const Launch& a : l.alt) write_launch(w, a);
}

Launch read_launch(Reader& r, int depth) {
  KILN_CHECK(depth < 2, kCorrupted, "generated kernel state: nested fallbacks");
  Launch l;
  l.kernel = r.str();
  for (uint32_t& v : l.grid) v = r.u32();
  for (uint32_t& v : l.block) v = r.u32();
  l.shared = r.u32();
  const uint32_t na = r.u32();
  KILN_CHECK(na <= kMaxArgs, kCorrupted, "generated kernel state: ", na, " arguments");
  for (uint32_t i = 0; i < na; ++i) {
    Arg a;
    uint8_t kind = 0;
    r.raw(&kind, 1);
    KILN_CHECK(kind <= uint8_t(ArgKind::kValue), kCorrupted, "generated kernel state: argument kind ", int(kind));
    a.kind = ArgKind(kind);
    a.index = int32_t(r.u32());
    a.offset = int64_t(r.u64());
    const uint32_t size = r.u32();
    KILN_CHECK(size <= 4096, kCorrupted, "generated kernel state: argument of ", size, " bytes");
    a.value.resize(size);
    r.raw(a.value.data(), size);
    KILN_CHECK(a.kind != ArgKind::kValue || size > 0, kCorrupted, "generated kernel state: empty value argument");
    l.args.push_back(std::move(a));
  }
  l.align = r.u32();
  const uint32_t nalt = r.u32();
  KILN_CHECK(nalt <= 1, kCorrupted, "generated kernel state: ", nalt, " fallbacks");
  for (uint32_t i = 0; i < nalt; ++i) l.alt.push_back(read_launch(r, depth + 1));
  return l;
}

}  // namespace

Bytes serialize(const Plan& p) {
  Writer w;
  w.u32(kPlanVersion);
  w.u64(p.workspace);
  w.str(p.describe);
  w.u32(uint32_t(p.launches.size()));
  for (const Launch& l : p.launches) write_launch(w, l);
  return std::move(w.out);
}

Plan deserialize(const Bytes& b) {
  Reader r{b};
  const uint32_t version = r.u32();
  KILN_CHECK(version == kPlanVersion, kCorrupted, "generated kernel state: plan version ", version, ", expected ",
             kPlanVersion);
  Plan p;
  p.workspace = r.u64();
  p.describe = r.str();
  const uint32_t n = r.u32();
  KILN_CHECK(n <= 4096, kCorrupted, "generated kernel state: ", n, " launches");
  for (uint32_t k = 0; k < n; ++k) p.launches.push_back(read_launch(r, 0));
  KILN_CHECK(r.pos == b.size(), kCorrupted, "generated kernel state: ", b.size() - r.pos, " trailing bytes");
  return p;
}

std::unique_ptr<Kernel> build(const Generated& g, const std::string& what, const Bytes* state) {
  if (state) {
    CompiledState cs = unpack_state(*state);
    Plan plan = deserialize(cs.params);
    std::shared_ptr<const Module> module;
    if (!cs.cubin.empty()) module = Module::load(std::move(cs.cubin));
    return std::make_unique<GenKernel>(std::move(module), std::move(plan));
  }
  std::shared_ptr<const Module> module;
  if (!g.plan.launches.empty()) module = Module::compile(g.source, what);
  return std::make_unique<GenKernel>(std::move(module), g.plan);
}

Bytes compile_for_arch(const std::string& source, const std::string& what, int arch) {
  return compile_to_cubin(source, what, arch);
}

std::string what_of(const Node& n) { return std::string(op_name(n.op)) + " node '" + n.name + "'"; }

const char* compute_of(DType t) {
  if (t == DType::kF32 || t == DType::kF16 || t == DType::kBF16) return "float";
  if (t == DType::kF64) return "double";
  return "long long";
}

std::string type_defs(const std::string& alias, DType t) {
  const std::string st = storage_type(t), c = compute_of(t);
  std::string ld, sto;
  if (t == DType::kF16 || t == DType::kBF16) {
    ld = "to_float(v)", sto = "from_float<" + st + ">(v)";
  } else if (t == DType::kBool) {
    ld = "(long long)v", sto = "v != 0";
  } else {
    ld = "(" + c + ")v", sto = "(" + st + ")v";
  }
  return "typedef " + st + " T_" + alias + ";\n__device__ __forceinline__ " + c + " ld_" + alias + "(T_" + alias +
         " v) { return " + ld + "; }\n__device__ __forceinline__ T_" + alias + " st_" + alias + "(" + c +
         " v) { return " + sto + "; }\n";
}

const char* word_type(int bytes) {
  switch (bytes) {
    case 1: return "unsigned char";
    case 2: return "unsigned short";
    case 4: return "unsigned int";
    case 8: return "unsigned long long";
    case 16: return "uint4";
  }
  KILN_FAIL(kInternal, "no word type of ", bytes, " bytes");
}

std::string source_head() {
  static const std::string head = prelude() + std::string(embedded_source("plan_helpers.cuh"));
  return head;
}

std::string define(const std::string& name, const std::string& value) { return "#define " + name + " " + value + "\n"; }
std::string define(const std::string& name, int64_t value) { return define(name, std::to_string(value)); }

std::optional<std::string> attr_problem(const Node& n, const std::string& key, AttrType type, bool required) {
  const auto it = n.attrs.items().find(key);
  if (it == n.attrs.items().end()) {
    if (!required) return std::nullopt;
    return detail::concat(op_name(n.op), ": missing attribute '", key, "'");
  }
  const AttrValue& v = it->second;
  switch (type) {
    case AttrType::kInt:
      if (std::holds_alternative<int64_t>(v) || std::holds_alternative<bool>(v)) return std::nullopt;
      return detail::concat(op_name(n.op), ": attribute '", key, "' is not of type int");
    case AttrType::kFloat:
      if (std::holds_alternative<double>(v) || std::holds_alternative<int64_t>(v)) return std::nullopt;
      return detail::concat(op_name(n.op), ": attribute '", key, "' is not of type float");
    case AttrType::kBool:
      if (std::holds_alternative<bool>(v)) return std::nullopt;
      return detail::concat(op_name(n.op), ": attribute '", key, "' is not of type bool");
    case AttrType::kInts:
      if (std::holds_alternative<std::vector<int64_t>>(v)) return std::nullopt;
      return detail::concat(op_name(n.op), ": attribute '", key, "' is not of type int list");
  }
  KILN_FAIL(kInternal, "attribute type ", int(type));
}

int word_bytes(int esz, std::initializer_list<int64_t> byte_counts) {
  for (int w : {16, 8, 4, 2, 1}) {
    if (w < esz) break;
    bool ok = true;
    for (int64_t b : byte_counts) ok = ok && b % w == 0;
    if (ok) return w;
  }
  return esz;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
  return s;
}

RowSplit split_row(int64_t n, int lanes, int esz) {
  RowSplit r;
  r.vec = std::max(1, 16 / esz);
  while (r.vec > 1 && n % r.vec != 0) r.vec /= 2;
  const int64_t per = (n + lanes - 1) / lanes;
  r.per_lane = int((per + r.vec - 1) / r.vec * r.vec);
  return r;
}

int row_lanes(int64_t n, int vec) {
  int lanes = 32;
  while (lanes > 1 && int64_t(lanes / 2) * vec >= n) lanes /= 2;
  return lanes;
}

std::string lanes_name(int lanes) {
  return lanes == 32 ? "warp" : std::to_string(lanes) + (lanes == 1 ? " lane" : " lanes");
}

uint32_t blocks_for(int64_t n, int64_t per_block) {
  const int64_t b = (n + per_block - 1) / std::max<int64_t>(per_block, 1);
  return uint32_t(std::clamp<int64_t>(b, 1, kMaxBlocks));
}

std::string SplitPlan::describe(const char* what, int vec) const {
  return " (split: " + std::to_string(splits) + " blocks per " + what + " of " + std::to_string(chunk) + " elements, " +
         std::to_string(vec) + "-wide loads)";
}

SplitPlan split_rows(int64_t rows, int64_t row_len, int64_t quantum, int64_t stat_bytes, const Target& t) {
  SplitPlan p;
  p.chunk = row_len;
  if (t.sms <= 0 || rows <= 0 || rows >= 2 * t.sms || row_len < kSplitMinRow) return p;
  const int64_t q = std::max<int64_t>(quantum, 1);
  const int64_t want = std::min((4 * t.sms + rows - 1) / rows, row_len / kSplitMinChunk);
  if (want < 2) return p;
  const int64_t chunk = ((row_len + want - 1) / want + q - 1) / q * q;
  const int64_t splits = (row_len + chunk - 1) / chunk;
  const uint64_t bytes =
      (uint64_t(rows) * uint64_t(splits) * uint64_t(std::max<int64_t>(stat_bytes, 1)) + 255) / 256 * 256;
  if (splits < 2 || bytes > t.workspace_limit) return p;
  p.splits = splits, p.chunk = chunk, p.workspace = bytes;
  return p;
}

namespace {

// One fill launch writing `bytes` bytes as words of w bytes (its kernel added to source once).
Launch fill_launch(std::string& source, int out, int64_t bytes, int w, const uint8_t (&pat)[16]) {
  const std::string name = std::string("kg_fill_") + std::to_string(w);
  const std::string params = define("KG_FILL_BYTES", w);
  if (source.find(params) == std::string::npos) source += params + std::string(embedded_source("plan_fill.cuh"));
  struct Pat {
    uint8_t b[16];
  } p;
  std::memcpy(p.b, pat, 16);
  const int64_t words = bytes / w;
  Launch l(name, blocks_for(words, 256), 256);
  l.out(out).val(p).i64(words);
  return l;
}

}  // namespace

void add_fill(std::string& source, Plan& plan, int out, int64_t count, int esz, uint64_t bits) {
  if (count <= 0) return;
  const int64_t bytes = count * esz;
  const int wide = word_bytes(esz, {bytes});
  // The pattern: the element's bytes repeated over a 16-byte word (a little-endian copy).
  uint8_t pat[16];
  for (int i = 0; i < 16; ++i) pat[i] = uint8_t(bits >> (8 * (i % esz)));
  if (source.empty()) source = source_head();
  Launch l = fill_launch(source, out, bytes, wide, pat);
  if (wide > esz) with_fallback(l, uint32_t(wide), fill_launch(source, out, bytes, esz, pat));
  plan.launches.push_back(std::move(l));
}

}  // namespace kiln::cuda::gen
