// The bundle file container and the check of its glue; the layout is in bundle_file.h.
//
// The reader uses the engine file's bounds-checked ByteReader, whose messages begin "engine file
// truncated" / "engine file corrupted"; errors of the bundle's own bytes are reworded to say
// "bundle" (as_bundle_error), those of an embedded engine are left to Bundle::deserialize to name.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>

#include "kiln/errors.h"
#include "src/runtime/bundle_file.h"
#include "src/serialize/byte_io.h"

namespace kiln::bundle_file {

namespace {

using serialize::ByteReader;
using serialize::ByteWriter;

constexpr size_t kMinInputBytes = 4 + 1 + 4;       // name length, dtype, rank
constexpr size_t kMinStepBytes = 4 + 4 + 4;        // name length, engine, nargs
constexpr size_t kMinRefBytes = 4 + 4;             // step, index
constexpr size_t kMinOutputBytes = 4 + kMinRefBytes + 1 + 4;  // name length, ref, dtype, rank
constexpr size_t kMinEngineBytes = 8;              // length
constexpr size_t kMinRangeBytes = 4 + 4 + 8 + 4;   // engine, built_at count, program length, pinned count
constexpr int64_t kMaxTensorBytes = int64_t(1) << 50;

// The message of `e` without its "[code] " prefix, "engine file" reworded to "bundle".
Error as_bundle_error(const Error& e) {
  std::string s = e.what();
  const size_t close = s.find("] ");
  if (!s.empty() && s[0] == '[' && close != std::string::npos) s = s.substr(close + 2);
  if (s.rfind("engine file ", 0) == 0) s = "bundle " + s.substr(12);
  return Error(e.code(), s);
}

uint64_t load_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

void write_ref(ByteWriter& w, const BundleRef& r) {
  w.i32(r.step);
  w.u32(r.index);
}

BundleRef read_ref(ByteReader& r) {
  BundleRef ref;
  ref.step = r.i32();
  ref.index = r.u32();
  return ref;
}

// A tensor's dtype and dims (extents, and symbols with their ranges); `what` names it in errors.
TensorType read_tensor(ByteReader& r, const std::string& what) {
  const uint8_t dtype = r.u8();
  if (dtype >= kNumDTypes) r.fail_corrupted(detail::concat(what, " has the unknown dtype code ", int(dtype)));
  TensorType t;
  t.dtype = DType(dtype);
  t.dims.resize(size_t(r.count32(8 + 4 + 16, "dimensions")));
  int64_t bytes = int64_t(dtype_size(t.dtype));
  for (Dim& d : t.dims) {
    d.extent = r.i64();
    d.symbol = r.str("a dimension's symbol");
    d.min = r.i64();
    d.max = r.i64();
    if (!d.is_static() && (d.min < 0 || d.extent < d.min || d.extent > d.max))
      r.fail_corrupted(detail::concat(what, " has the dim ", d.symbol, " = ", d.extent, " outside its range [", d.min,
                                      ", ", d.max, "]"));
    if (d.extent < 0 || (d.extent > 0 && bytes > kMaxTensorBytes / d.extent))
      r.fail_corrupted(detail::concat(what, " has the impossible extent ", d.extent));
    bytes *= d.extent;
  }
  return t;
}

// A tensor: dtype, rank, per dim its extent, symbol ("" when static), min and max (0 when static).
void write_tensor(ByteWriter& w, const TensorType& t) {
  w.u8(uint8_t(t.dtype));
  w.u32(uint32_t(t.rank()));
  for (const Dim& d : t.dims) {
    w.i64(d.extent);
    w.str(d.symbol, "a dimension's symbol");
    w.i64(d.is_static() ? 0 : d.min);
    w.i64(d.is_static() ? 0 : d.max);
  }
}

void write_binding(ByteWriter& w, const SymbolBinding& b) {
  w.u32(uint32_t(b.size()));
  for (const auto& [symbol, value] : b) {
    w.str(symbol, "a symbol's name");
    w.i64(value);
  }
}

SymbolBinding read_binding(ByteReader& r) {
  SymbolBinding b;
  const uint64_t n = r.count32(4 + 8, "symbols of a binding");
  for (uint64_t i = 0; i < n; ++i) {
    std::string symbol = r.str("a symbol's name");
    const int64_t value = r.i64();
    if (!b.emplace(std::move(symbol), value).second) r.fail_corrupted("a binding that names a symbol twice");
  }
  return b;
}

// The container checks and the glue; throws with the ByteReader's "engine file" wording.
BundleFile read_unnamed(const uint8_t* data, size_t size) {
  KILN_CHECK(data != nullptr || size == 0, kInvalidArgument, "bundle data is null");
  const size_t magic_bytes = std::min(size, sizeof kMagic);
  KILN_CHECK(magic_bytes == 0 || std::memcmp(data, kMagic, magic_bytes) == 0, kCorrupted,
             "not a Kiln bundle: bad magic (expected \"KILNBDL\\0\")");
  KILN_CHECK(size >= sizeof kMagic, kTruncated, "bundle truncated: ", size, " bytes, shorter than its 8-byte magic");
  ByteReader head(data, size, 0, "header");
  head.take(sizeof kMagic);
  const uint32_t version = head.u32();
  KILN_CHECK(version == kBundleFormatVersion, kVersionMismatch, "bundle format version ", version,
             ", this Kiln reads format version ", kBundleFormatVersion, "; save the program again with this Kiln");
  const uint64_t declared = head.u64();
  KILN_CHECK(declared >= kFixedHeaderBytes + kTrailerBytes, kCorrupted,
             "bundle corrupted: its header records a size of ", declared, " bytes");
  KILN_CHECK(size >= declared, kTruncated, "bundle truncated: it has ", size, " bytes, its header records ", declared);
  KILN_CHECK(size == declared, kCorrupted, "bundle corrupted: it has ", size - declared,
             " bytes past the end its header records (", declared, " bytes)");
  const size_t body = size - kTrailerBytes;
  const uint64_t stored = load_u64(data + body), computed = serialize::checksum64(data, body);
  if (stored != computed) {
    char msg[96];
    std::snprintf(msg, sizeof msg, "stored %016llx, computed %016llx", static_cast<unsigned long long>(stored),
                  static_cast<unsigned long long>(computed));
    KILN_FAIL(kCorrupted, "bundle checksum mismatch (", msg, "): the file is damaged");
  }

  BundleFile f;
  ByteReader r(data, body, 0, "the bundle's header");
  r.take(kFixedHeaderBytes);
  f.kiln_version = r.str("the Kiln version");

  r = ByteReader(data + r.offset(), body - r.offset(), r.offset(), "the bundle's glue");
  BundleProgram& p = f.program;
  p.inputs.resize(size_t(r.count32(kMinInputBytes, "program inputs")));
  for (IOTensor& in : p.inputs) {
    in.name = r.str("a program input's name");
    in.type = read_tensor(r, "program input '" + in.name + "'");
  }
  p.steps.resize(size_t(r.count32(kMinStepBytes, "steps")));
  for (BundleStep& s : p.steps) {
    s.name = r.str("a step's name");
    s.engine = r.u32();
    s.args.resize(size_t(r.count32(kMinRefBytes, "step arguments")));
    for (BundleRef& a : s.args) a = read_ref(r);
  }
  p.outputs.resize(size_t(r.count32(kMinOutputBytes, "program outputs")));
  for (BundleOutput& o : p.outputs) {
    o.name = r.str("a program output's name");
    o.ref = read_ref(r);
    o.type = read_tensor(r, "program output '" + o.name + "'");
  }
  p.ranges.resize(size_t(r.count32(kMinRangeBytes, "engine ranges")));
  for (BundleRange& range : p.ranges) {
    range.engine = r.u32();
    range.built_at = read_binding(r);
    const uint64_t length = r.u64();
    const uint8_t* bytes = r.take(length);
    range.program = SizeProgram::deserialize(bytes, size_t(length));
    range.pinned = read_binding(r);
  }

  r = ByteReader(data + r.offset(), body - r.offset(), r.offset(), "the bundle's engines");
  f.engines.resize(size_t(r.count32(kMinEngineBytes, "engines")));
  for (auto& e : f.engines) {
    const uint64_t length = r.u64();
    r.align(kEngineAlignment);
    e = std::span<const uint8_t>(r.take(length), size_t(length));
  }
  if (!r.done()) r.fail_corrupted(detail::concat(r.remaining(), " unread bytes at offset ", r.offset()));
  return f;
}

std::string ref_text(const BundleRef& r) {
  return r.step < 0 ? detail::concat("program input ", r.index)
                    : detail::concat("output ", r.index, " of step ", r.step);
}

}  // namespace

Bytes write(const std::string& kiln_version, const BundleProgram& program,
            const std::vector<std::span<const uint8_t>>& engines) {
  ByteWriter w;
  size_t total = 0;
  for (const auto& e : engines) total += e.size() + kEngineAlignment + 8;
  w.reserve(total + 4096);
  w.bytes(kMagic, sizeof kMagic);
  w.u32(kBundleFormatVersion);
  const size_t size_at = w.size();
  w.u64(0);
  w.str(kiln_version, "the Kiln version");
  w.u32(uint32_t(program.inputs.size()));
  for (const IOTensor& in : program.inputs) {
    w.str(in.name, "a program input's name");
    write_tensor(w, in.type);
  }
  w.u32(uint32_t(program.steps.size()));
  for (const BundleStep& s : program.steps) {
    w.str(s.name, "a step's name");
    w.u32(s.engine);
    w.u32(uint32_t(s.args.size()));
    for (const BundleRef& a : s.args) write_ref(w, a);
  }
  w.u32(uint32_t(program.outputs.size()));
  for (const BundleOutput& o : program.outputs) {
    w.str(o.name, "a program output's name");
    write_ref(w, o.ref);
    write_tensor(w, o.type);
  }
  w.u32(uint32_t(program.ranges.size()));
  for (const BundleRange& range : program.ranges) {
    w.u32(range.engine);
    write_binding(w, range.built_at);
    const Bytes bytes = range.program.serialize();
    w.u64(bytes.size());
    w.bytes(bytes.data(), bytes.size());
    write_binding(w, range.pinned);
  }
  w.u32(uint32_t(engines.size()));
  for (const auto& e : engines) {
    w.u64(e.size());
    w.pad_to(kEngineAlignment);
    w.bytes(e.data(), e.size());
  }
  w.patch_u64(size_at, w.size() + kTrailerBytes);
  w.u64(serialize::checksum64(w.buffer().data(), w.size()));
  return std::move(w.buffer());
}

BundleFile read(const uint8_t* data, size_t size) {
  try {
    return read_unnamed(data, size);
  } catch (const Error& e) {
    throw as_bundle_error(e);
  }
}

std::string program_problem(const BundleProgram& p, const std::vector<EngineIO>& engines,
                            std::vector<IOTensor>* outputs) {
  if (engines.empty()) return "it holds no engine";
  // Types of the values defined so far: program inputs, then each step's outputs.
  std::vector<const std::vector<IOTensor>*> step_outputs;
  auto type_of = [&](const BundleRef& r) -> const IOTensor* {
    if (r.step < 0) return r.step == -1 && r.index < p.inputs.size() ? &p.inputs[r.index] : nullptr;
    if (size_t(r.step) >= step_outputs.size()) return nullptr;
    const auto& outs = *step_outputs[size_t(r.step)];
    return r.index < outs.size() ? &outs[r.index] : nullptr;
  };
  // A dynamic program's engines were built at sizes of their own: types compare by dtype and rank
  // here, and by extent once Bundle::at made the program static.
  std::set<std::string> symbols;
  for (const IOTensor& in : p.inputs)
    for (const Dim& d : in.type.dims)
      if (!d.is_static()) symbols.insert(d.symbol);
  const bool sized = symbols.empty() && p.ranges.empty();
  auto same = [&](const TensorType& a, const TensorType& b) {
    return a.dtype == b.dtype && (sized ? a.shape() == b.shape() : a.rank() == b.rank());
  };
  std::set<uint32_t> ranged;
  for (size_t i = 0; i < p.ranges.size(); ++i) {
    const BundleRange& r = p.ranges[i];
    if (r.engine >= engines.size() || !ranged.insert(r.engine).second)
      return detail::concat("range ", i, " is of engine ", r.engine, ", which is not an engine or has a range already");
    std::set<std::string> fitted(r.program.symbols().begin(), r.program.symbols().end()), at;
    for (const auto& [name, value] : r.built_at) at.insert(name);
    if (at != fitted)
      return detail::concat("range ", i, " (engine ", r.engine,
                            ") records where it was built for other symbols than "
                            "its size program's");
    for (const std::string& name : fitted)
      if (!symbols.count(name))
        return detail::concat("range ", i, " (engine ", r.engine, ") fits the symbol ", name,
                              ", which no program input has");
    for (const auto& [name, value] : r.pinned)
      if (!symbols.count(name))
        return detail::concat("range ", i, " (engine ", r.engine, ") holds the symbol ", name,
                              ", which no program input has");
  }
  for (size_t s = 0; s < p.steps.size(); ++s) {
    const BundleStep& step = p.steps[s];
    const std::string where = detail::concat("step ", s, " ('", step.name, "')");
    if (step.engine >= engines.size())
      return detail::concat(where, " calls engine ", step.engine, ", there are ", engines.size());
    const EngineIO& io = engines[step.engine];
    if (step.args.size() != io.inputs.size())
      return detail::concat(where, " passes ", step.args.size(), " arguments to engine ", step.engine, ", which takes ",
                            io.inputs.size());
    for (size_t a = 0; a < step.args.size(); ++a) {
      const IOTensor* v = type_of(step.args[a]);
      if (!v)
        return detail::concat(where, " argument ", a, " is ", ref_text(step.args[a]),
                              ", which is not a program input or an earlier step's output");
      if (!same(v->type, io.inputs[a].type))
        return detail::concat(where, " passes ", ref_text(step.args[a]), " '", v->name, "' (", v->type.to_string(),
                              ") to engine ", step.engine, " input ", a, " '", io.inputs[a].name, "' (",
                              io.inputs[a].type.to_string(), ")");
    }
    step_outputs.push_back(&io.outputs);
  }
  std::vector<IOTensor> types;
  for (size_t o = 0; o < p.outputs.size(); ++o) {
    const IOTensor* v = type_of(p.outputs[o].ref);
    if (!v)
      return detail::concat("program output ", o, " ('", p.outputs[o].name, "') is ", ref_text(p.outputs[o].ref),
                            ", which is not a program input or a step's output");
    if (!same(v->type, p.outputs[o].type))
      return detail::concat("program output ", o, " ('", p.outputs[o].name, "') is ", p.outputs[o].type.to_string(),
                            ", its value ", ref_text(p.outputs[o].ref), " '", v->name, "' is ", v->type.to_string());
    types.push_back({p.outputs[o].name, p.outputs[o].type});
  }
  if (outputs) *outputs = std::move(types);
  return "";
}

}  // namespace kiln::bundle_file
