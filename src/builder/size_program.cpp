// SizeProgram (kiln/size_program.h): fitting a plan's integers to its shape symbols from plans
// optimized at sample bindings, and writing them back for another binding.
//
// The samples are walked side by side (values, then nodes, then fused bodies, in id order).
// Everything but an integer must be equal; integers are gathered per position with their value
// in every sample. A position whose value differs is a slot: a multilinear function fitted by
// interpolating the grid corners, plus a square term per symbol where the samples that move one
// symbol alone need it, checked at the other samples.
#include <cmath>
#include <cstring>
#include <sstream>
#include <utility>

#include "kiln/errors.h"
#include "kiln/size_program.h"
#include "src/common/element_access.h"
#include "src/serialize/byte_io.h"

namespace kiln {

namespace {

constexpr size_t kMaxSymbols = 4;
// Integer constants of at most this many elements are fitted element by element (an index the
// importers computed from a size, a folded scalar); larger ones and other dtypes must be equal.
constexpr int64_t kMaxFittedConstant = 4096;

bool fitted_constant(const Value& v) {
  return v.is_constant() && (v.type.dtype == DType::kI64 || v.type.dtype == DType::kI32) &&
         v.type.numel() <= kMaxFittedConstant;
}

struct Found {
  SizeProgram::Slot slot;
  std::vector<int64_t> values;  // per sample
};

std::string body_text(const std::vector<size_t>& body) {
  std::string s;
  for (size_t i : body) s += detail::concat("node ", i, " body: ");
  return s;
}

// Whether every value is a double holding a whole number of at most 2^53.
bool whole_numbers(const std::vector<const AttrValue*>& all) {
  for (const AttrValue* a : all) {
    const double v = std::get<double>(*a);
    if (!(std::fabs(v) <= 9007199254740992.0) || v != std::floor(v)) return false;
  }
  return true;
}

// Walks the same graph position in every sample, appending its integers to `found` and
// throwing kUnsupported at the first other difference.
class Walker {
 public:
  explicit Walker(std::vector<Found>& found) : found_(found) {}

  void walk(const std::vector<const Graph*>& gs, const std::vector<size_t>& body) {
    const Graph& g0 = *gs[0];
    for (size_t k = 1; k < gs.size(); ++k) {
      const Graph& g = *gs[k];
      same(k, body, "its value count", g.num_values() == g0.num_values());
      same(k, body, "its node count", g.nodes().size() == g0.nodes().size());
      same(k, body, "its inputs", g.inputs() == g0.inputs());
      same(k, body, "its outputs", g.outputs() == g0.outputs());
    }
    for (ValueId v = 0; v < g0.num_values(); ++v) value(gs, body, v);
    for (size_t i = 0; i < g0.nodes().size(); ++i) node(gs, body, i);
  }

 private:
  static void same(size_t k, const std::vector<size_t>& body, const std::string& what, bool equal) {
    KILN_CHECK(equal, kUnsupported, "the plan at sample ", k, " differs from sample 0 in ", body_text(body), what);
  }

  void add(const std::vector<size_t>& body, SizeProgram::Slot::Kind kind, size_t index, const std::string& key,
           size_t element, std::vector<int64_t> values) {
    Found f;
    f.slot.body = body;
    f.slot.kind = kind;
    f.slot.index = index;
    f.slot.key = key;
    f.slot.element = element;
    f.values = std::move(values);
    found_.push_back(std::move(f));
  }

  void value(const std::vector<const Graph*>& gs, const std::vector<size_t>& body, ValueId id) {
    const Value& v0 = gs[0]->value(id);
    const std::string at = detail::concat("value ", id, " ('", v0.name, "')");
    for (size_t k = 1; k < gs.size(); ++k) {
      const Value& v = gs[k]->value(id);
      // A constant that is no weight is named for a reader of the plan only (a refittable
      // engine's build renames those it derives from weights: refit_record.cpp); weights are
      // addressed by name.
      const bool derived = v0.is_constant() && !v0.is_weight && v.is_constant() && !v.is_weight;
      same(k, body, at + ": name or role",
           (v.name == v0.name || derived) && v.is_input == v0.is_input && v.is_weight == v0.is_weight &&
               v.output_index == v0.output_index && (v.producer == nullptr) == (v0.producer == nullptr));
      same(k, body, at + ": dtype or rank", v.type.dtype == v0.type.dtype && v.type.rank() == v0.type.rank());
      for (size_t d = 0; d < v0.type.dims.size(); ++d) {
        const Dim &a = v.type.dims[d], &b = v0.type.dims[d];
        same(k, body, at + ": a symbolic dim", a.symbol == b.symbol && a.min == b.min && a.max == b.max);
      }
      same(k, body, at + ": being a constant", v.is_constant() == v0.is_constant());
      if (v0.is_constant() && v.data != v0.data && !fitted_constant(v0))
        same(k, body, at + ": the constant's bytes",
             v.data->size() == v0.data->size() && std::memcmp(v.data->data(), v0.data->data(), v.data->size()) == 0);
    }
    if (fitted_constant(v0)) {
      for (size_t k = 1; k < gs.size(); ++k)
        same(k, body, at + ": the constant's element count", gs[k]->value(id).type.numel() == v0.type.numel());
      for (size_t e = 0; e < size_t(v0.type.numel()); ++e) {
        std::vector<int64_t> values;
        for (const Graph* g : gs) values.push_back(load_index(g->value(id).data->data(), v0.type.dtype, int64_t(e)));
        add(body, SizeProgram::Slot::kConstant, size_t(id), {}, e, std::move(values));
      }
    }
    for (size_t d = 0; d < v0.type.dims.size(); ++d) {
      std::vector<int64_t> values;
      for (const Graph* g : gs) values.push_back(g->value(id).type.dims[d].extent);
      add(body, SizeProgram::Slot::kExtent, size_t(id), {}, d, std::move(values));
    }
  }

  void node(const std::vector<const Graph*>& gs, const std::vector<size_t>& body, size_t i) {
    const Node& n0 = *gs[0]->nodes()[i];
    const std::string at = detail::concat("node ", i, " (", op_name(n0.op), " '", n0.name, "')");
    for (size_t k = 1; k < gs.size(); ++k) {
      const Node& n = *gs[k]->nodes()[i];
      same(k, body, at + ": op, operands or name",
           n.op == n0.op && n.inputs == n0.inputs && n.outputs == n0.outputs && n.name == n0.name);
      same(k, body, at + ": its attribute names", n.attrs.items().size() == n0.attrs.items().size());
      same(k, body, at + ": having a body", (n.body == nullptr) == (n0.body == nullptr));
    }
    for (const auto& [key, a0] : n0.attrs.items()) {
      const std::string attr = at + ": attribute '" + key + "'";
      std::vector<const AttrValue*> all;
      for (size_t k = 0; k < gs.size(); ++k) {
        const auto& items = gs[k]->nodes()[i]->attrs.items();
        const auto it = items.find(key);
        same(k, body, attr, it != items.end() && it->second.index() == a0.index());
        all.push_back(&it->second);
      }
      if (std::holds_alternative<int64_t>(a0)) {
        std::vector<int64_t> values;
        for (const AttrValue* a : all) values.push_back(std::get<int64_t>(*a));
        add(body, SizeProgram::Slot::kAttr, i, key, 0, std::move(values));
      } else if (const auto* list0 = std::get_if<std::vector<int64_t>>(&a0)) {
        for (size_t k = 1; k < all.size(); ++k)
          same(k, body, attr + "'s length", std::get<std::vector<int64_t>>(*all[k]).size() == list0->size());
        for (size_t e = 0; e < list0->size(); ++e) {
          std::vector<int64_t> values;
          for (const AttrValue* a : all) values.push_back(std::get<std::vector<int64_t>>(*a)[e]);
          add(body, SizeProgram::Slot::kAttrElement, i, key, e, std::move(values));
        }
      } else if (std::holds_alternative<double>(a0) && whole_numbers(all)) {
        std::vector<int64_t> values;  // a size passed as a float (arange's end)
        for (const AttrValue* a : all) values.push_back(int64_t(std::get<double>(*a)));
        add(body, SizeProgram::Slot::kFloatAttr, i, key, 0, std::move(values));
      } else {
        for (size_t k = 1; k < all.size(); ++k) same(k, body, attr, *all[k] == a0);
      }
    }
    if (n0.body) {
      std::vector<const Graph*> bodies;
      for (const Graph* g : gs) bodies.push_back(g->nodes()[i]->body.get());
      std::vector<size_t> inner = body;
      inner.push_back(i);
      walk(bodies, inner);
    }
  }

  std::vector<Found>& found_;
};

// A rational number num / den, den > 0.
struct Ratio {
  __int128 num = 0, den = 1;
};

__int128 gcd(__int128 a, __int128 b) {
  if (a < 0) a = -a;
  if (b < 0) b = -b;
  while (b != 0) a = std::exchange(b, a % b);
  return a;
}

Ratio reduced(__int128 num, __int128 den) {
  if (den < 0) num = -num, den = -den;
  const __int128 g = gcd(num, den);
  return g > 1 ? Ratio{num / g, den / g} : Ratio{num, den};
}

// The multilinear interpolation of `corners` (grid corners lo/hi per symbol) at `x`.
Ratio interpolate(const std::vector<int64_t>& corners, const std::vector<int64_t>& lo, const std::vector<int64_t>& hi,
                  const std::vector<int64_t>& x) {
  __int128 num = 0, den = 1;
  for (size_t i = 0; i < lo.size(); ++i) den *= hi[i] - lo[i];
  for (size_t c = 0; c < corners.size(); ++c) {
    __int128 term = corners[c];
    for (size_t i = 0; i < lo.size(); ++i) term *= (c >> i & 1) ? x[i] - lo[i] : hi[i] - x[i];
    num += term;
  }
  return reduced(num, den);
}

// (x - lo) * (x - hi) of symbol i: the square term's factor, zero at the grid corners.
__int128 bend(const std::vector<int64_t>& lo, const std::vector<int64_t>& hi, const std::vector<int64_t>& x, size_t i) {
  return __int128(x[i] - lo[i]) * (x[i] - hi[i]);
}

// A slot's value at `x`: the corners' interpolation plus its square terms.
Ratio slot_value(const SizeProgram::Slot& s, const std::vector<int64_t>& lo, const std::vector<int64_t>& hi,
                 const std::vector<int64_t>& x) {
  Ratio r = interpolate(s.corners, lo, hi, x);
  for (size_t i = 0; i < s.squares.size(); ++i) {
    const auto [num, den] = s.squares[i];
    if (num != 0) r = reduced(r.num * den + __int128(num) * bend(lo, hi, x, i) * r.den, r.den * den);
  }
  return r;
}

// Whether `r` is a whole number in int64's range, written to `out`.
bool whole(const Ratio& r, int64_t* out) {
  if (r.num % r.den != 0) return false;
  const __int128 v = r.num / r.den;
  if (v < INT64_MIN || v > INT64_MAX) return false;
  *out = int64_t(v);
  return true;
}

// The square terms that make `values` fit where the interpolation of the corners does not: per
// symbol, from the first check sample that moves that symbol alone (the others at their sample 0
// values), where another such sample remains to verify it. Empty when no sample needs one.
std::vector<std::pair<int64_t, int64_t>> fit_squares(const SizeProgram::Slot& s, const std::vector<int64_t>& values,
                                                     const std::vector<std::vector<int64_t>>& x,
                                                     const std::vector<int64_t>& lo, const std::vector<int64_t>& hi,
                                                     size_t corners) {
  const size_t n = lo.size();
  std::vector<std::pair<int64_t, int64_t>> squares(n, {0, 1});
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    std::vector<size_t> axis;
    for (size_t k = corners; k < x.size(); ++k) {
      bool alone = x[k][i] != lo[i] && x[k][i] != hi[i];
      for (size_t j = 0; j < n && alone; ++j) alone = j == i || x[k][j] == lo[j];
      if (alone) axis.push_back(k);
    }
    if (axis.size() < 2) continue;
    const size_t k = axis[0];
    const Ratio at = interpolate(s.corners, lo, hi, x[k]);
    const Ratio q = reduced(__int128(values[k]) * at.den - at.num, at.den * bend(lo, hi, x[k], i));
    if (q.num == 0) continue;
    if (q.num < INT64_MIN || q.num > INT64_MAX || q.den > INT64_MAX) return {};
    squares[i] = {int64_t(q.num), int64_t(q.den)};
    any = true;
  }
  return any ? squares : std::vector<std::pair<int64_t, int64_t>>{};
}

std::string binding_text(const std::vector<std::string>& symbols, const std::vector<int64_t>& x) {
  std::string s;
  for (size_t i = 0; i < symbols.size(); ++i) s += detail::concat(i ? ", " : "", symbols[i], "=", x[i]);
  return s;
}

// The graph a slot lives in: `g` or a fused body inside it (kInvalidArgument when `g` has none there).
Graph& graph_of(Graph& g, const std::vector<size_t>& body) {
  Graph* at = &g;
  for (size_t i : body) {
    KILN_CHECK(i < at->nodes().size() && at->nodes()[i]->body, kInvalidArgument,
               "size program: the base plan has no fused body at node ", i);
    at = at->nodes()[i]->body.get();
  }
  return *at;
}

}  // namespace

std::string SizeProgram::Slot::where() const {
  std::string s = body_text(body);
  switch (kind) {
    case kExtent: return s + detail::concat("value ", index, " dim ", element);
    case kAttr:
    case kFloatAttr: return s + detail::concat("node ", index, " attr '", key, "'");
    case kAttrElement: return s + detail::concat("node ", index, " attr '", key, "'[", element, "]");
    case kConstant: return s + detail::concat("value ", index, " element ", element);
  }
  return s;
}

SizeProgram SizeProgram::fit(const std::vector<SizeSample>& samples) {
  KILN_CHECK(!samples.empty(), kInvalidArgument, "size program: no samples");
  SizeProgram p;
  for (const auto& [name, value] : samples[0].binding) p.symbols_.push_back(name);
  const size_t n = p.symbols_.size(), corners = size_t(1) << n;
  KILN_CHECK(n >= 1 && n <= kMaxSymbols, kInvalidArgument, "size program: ", n, " symbols (1 to ", kMaxSymbols,
             " are fitted)");
  KILN_CHECK(samples.size() > corners, kInvalidArgument, "size program: ", n, " symbols need ", corners,
             " grid samples and at least one more to check them, got ", samples.size());
  std::vector<std::vector<int64_t>> x(samples.size());
  for (size_t k = 0; k < samples.size(); ++k) {
    KILN_CHECK(samples[k].binding.size() == n, kInvalidArgument, "size program: sample ", k, " binds ",
               samples[k].binding.size(), " symbols, sample 0 binds ", n);
    for (const std::string& s : p.symbols_) {
      const auto it = samples[k].binding.find(s);
      KILN_CHECK(it != samples[k].binding.end(), kInvalidArgument, "size program: sample ", k, " does not bind ", s);
      x[k].push_back(it->second);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    p.lo_.push_back(x[0][i]);
    p.hi_.push_back(x[size_t(1) << i][i]);
    KILN_CHECK(p.lo_[i] != p.hi_[i], kInvalidArgument, "size program: samples 0 and ", size_t(1) << i, " must bind ",
               p.symbols_[i], " to two values");
  }
  for (size_t c = 0; c < corners; ++c)
    for (size_t i = 0; i < n; ++i)
      KILN_CHECK(x[c][i] == ((c >> i & 1) ? p.hi_[i] : p.lo_[i]), kInvalidArgument, "size program: sample ", c,
                 " is not a grid corner (", binding_text(p.symbols_, x[c]), ")");

  std::vector<Found> found;
  std::vector<const Graph*> gs;
  for (const SizeSample& s : samples) gs.push_back(&s.plan);
  Walker(found).walk(gs, {});
  for (Found& f : found) {
    bool varies = false;
    for (int64_t v : f.values) varies |= v != f.values[0];
    if (!varies) continue;
    f.slot.corners.assign(f.values.begin(), f.values.begin() + long(corners));
    // Whether the slot's value at sample k is whole (then written to `want`).
    const auto value_at = [&](size_t k, int64_t* want) { return whole(slot_value(f.slot, p.lo_, p.hi_, x[k]), want); };
    bool multilinear = true;
    int64_t want = 0;
    for (size_t k = corners; k < samples.size() && multilinear; ++k)
      multilinear = value_at(k, &want) && want == f.values[k];
    if (!multilinear) {  // square terms where they fit, then every check sample again
      f.slot.squares = fit_squares(f.slot, f.values, x, p.lo_, p.hi_, corners);
      for (size_t k = corners; k < samples.size(); ++k) {
        const bool is_whole = value_at(k, &want);
        KILN_CHECK(is_whole && want == f.values[k], kUnsupported, "size program: ", f.slot.where(), " is ", f.values[k],
                   " at ", binding_text(p.symbols_, x[k]),
                   ", not the multilinear function of the grid "
                   "samples",
                   f.slot.squares.empty() ? "" : " plus a square of a symbol", " (",
                   is_whole ? std::to_string(want) : std::string("not a whole number"), ")");
      }
    }
    p.slots_.push_back(std::move(f.slot));
  }
  return p;
}

Graph SizeProgram::evaluate(const Graph& base, const SymbolBinding& binding) const {
  KILN_CHECK(binding.size() == symbols_.size(), kInvalidArgument, "size program of ", symbols_.size(),
             " symbols given a binding of ", binding.size());
  std::vector<int64_t> x;
  for (const std::string& s : symbols_) {
    const auto it = binding.find(s);
    KILN_CHECK(it != binding.end(), kInvalidArgument, "size program: the binding lacks ", s);
    x.push_back(it->second);
  }
  Graph g = base;
  // Constants with fitted elements get bytes of their own (the base's stay as they are).
  std::map<std::pair<const Graph*, size_t>, std::shared_ptr<HostBuffer>> own;
  for (const Slot& slot : slots_) {
    int64_t v = 0;
    KILN_CHECK(whole(slot_value(slot, lo_, hi_, x), &v) && v >= 0, kUnsupported, "size program: ", slot.where(),
               " is not a whole, non-negative number at ", binding_text(symbols_, x));
    Graph& at = graph_of(g, slot.body);
    if (slot.kind == Slot::kConstant) {
      KILN_CHECK(slot.index < size_t(at.num_values()) && fitted_constant(at.value(ValueId(slot.index))) &&
                     int64_t(slot.element) < at.value(ValueId(slot.index)).type.numel(),
                 kInvalidArgument, "size program: the base plan has no ", slot.where());
      Value& c = at.value(ValueId(slot.index));
      std::shared_ptr<HostBuffer>& bytes = own[{&at, slot.index}];
      if (!bytes) {
        bytes = std::make_shared<HostBuffer>(*c.data);
        c.data = bytes;
      }
      if (c.type.dtype == DType::kI64) {
        std::memcpy(bytes->data() + slot.element * 8, &v, 8);
      } else {
        KILN_CHECK(v <= INT32_MAX, kUnsupported, "size program: ", slot.where(), " is ", v, ", over i32's range");
        const int32_t x = int32_t(v);
        std::memcpy(bytes->data() + slot.element * 4, &x, 4);
      }
      continue;
    }
    if (slot.kind == Slot::kExtent) {
      KILN_CHECK(slot.index < size_t(at.num_values()) && slot.element < at.value(ValueId(slot.index)).type.dims.size(),
                 kInvalidArgument, "size program: the base plan has no ", slot.where());
      at.value(ValueId(slot.index)).type.dims[slot.element].extent = v;
      continue;
    }
    KILN_CHECK(slot.index < at.nodes().size() && at.nodes()[slot.index]->attrs.has(slot.key), kInvalidArgument,
               "size program: the base plan has no ", slot.where());
    Attrs& attrs = at.nodes()[slot.index]->attrs;
    if (slot.kind == Slot::kAttr) {
      attrs.set(slot.key, v);
    } else if (slot.kind == Slot::kFloatAttr) {
      attrs.set(slot.key, double(v));
    } else {
      std::vector<int64_t> list = attrs.get_ints(slot.key);
      KILN_CHECK(slot.element < list.size(), kInvalidArgument, "size program: the base plan has no ", slot.where());
      list[slot.element] = v;
      attrs.set(slot.key, std::move(list));
    }
  }
  try {
    g.verify();
  } catch (const Error& e) {
    KILN_FAIL(kUnsupported, "size program: the plan at ", binding_text(symbols_, x), " does not hold: ", e.what());
  }
  return g;
}

// Layout: u32 nsymbols, per symbol: str name, i64 lo, i64 hi; u32 nslots, per slot: u32 depth,
// depth x u64 body index, u8 kind, u64 index, str key, u64 element, 2^nsymbols x i64 corner.
// Where a slot has square terms, then: u32 count, per such slot: u32 slot, nsymbols x (i64 num,
// i64 den). A program without them ends after the slots, as before square terms existed.
Bytes SizeProgram::serialize() const {
  serialize::ByteWriter w;
  w.u32(uint32_t(symbols_.size()));
  for (size_t i = 0; i < symbols_.size(); ++i) {
    w.str(symbols_[i], "a size program's symbol");
    w.i64(lo_[i]);
    w.i64(hi_[i]);
  }
  w.u32(uint32_t(slots_.size()));
  for (const Slot& s : slots_) {
    w.u32(uint32_t(s.body.size()));
    for (size_t b : s.body) w.u64(b);
    w.u8(uint8_t(s.kind));
    w.u64(s.index);
    w.str(s.key, "a size program's attribute name");
    w.u64(s.element);
    for (int64_t c : s.corners) w.i64(c);
  }
  uint32_t squared = 0;
  for (const Slot& s : slots_) squared += !s.squares.empty();
  if (squared) {
    w.u32(squared);
    for (size_t k = 0; k < slots_.size(); ++k) {
      if (slots_[k].squares.empty()) continue;
      w.u32(uint32_t(k));
      for (const auto& [num, den] : slots_[k].squares) {
        w.i64(num);
        w.i64(den);
      }
    }
  }
  return std::move(w.buffer());
}

SizeProgram SizeProgram::deserialize(const uint8_t* data, size_t size) {
  serialize::ByteReader r(data, size, 0, "a size program");
  SizeProgram p;
  const uint64_t n = r.count32(4 + 16, "size program symbols");
  if (n < 1 || n > kMaxSymbols) r.fail_corrupted(detail::concat("a size program of ", n, " symbols"));
  for (uint64_t i = 0; i < n; ++i) {
    p.symbols_.push_back(r.str("a size program's symbol"));
    p.lo_.push_back(r.i64());
    p.hi_.push_back(r.i64());
    if (p.lo_.back() == p.hi_.back())
      r.fail_corrupted("a size program whose grid has one value of " + p.symbols_.back());
  }
  const size_t corners = size_t(1) << n;
  p.slots_.resize(size_t(r.count32(4 + 1 + 8 + 4 + 8 + 8 * corners, "size program slots")));
  for (Slot& s : p.slots_) {
    s.body.resize(size_t(r.count32(8, "fused body indices")));
    for (size_t& b : s.body) b = size_t(r.u64());
    const uint8_t kind = r.u8();
    if (kind > Slot::kConstant) r.fail_corrupted(detail::concat("a size program slot of unknown kind ", int(kind)));
    s.kind = Slot::Kind(kind);
    s.index = size_t(r.u64());
    s.key = r.str("a size program's attribute name");
    s.element = size_t(r.u64());
    for (size_t c = 0; c < corners; ++c) s.corners.push_back(r.i64());
  }
  if (!r.done()) {
    const uint64_t squared = r.count32(4 + 16 * n, "size program square terms");
    for (uint64_t k = 0; k < squared; ++k) {
      const uint32_t slot = r.u32();
      if (slot >= p.slots_.size() || !p.slots_[slot].squares.empty())
        r.fail_corrupted(detail::concat("square terms for slot ", slot, " of ", p.slots_.size(), ", or twice"));
      for (uint64_t i = 0; i < n; ++i) {
        const int64_t num = r.i64(), den = r.i64();
        if (den <= 0) r.fail_corrupted(detail::concat("a square term's denominator of ", den));
        p.slots_[slot].squares.emplace_back(num, den);
      }
    }
  }
  if (!r.done()) r.fail_corrupted(detail::concat(r.remaining(), " bytes after the size program"));
  return p;
}

std::string SizeProgram::to_string() const {
  std::ostringstream os;
  for (const Slot& s : slots_) {
    os << s.where() << ":";
    for (int64_t c : s.corners) os << " " << c;
    for (size_t i = 0; i < s.squares.size(); ++i)
      if (s.squares[i].first != 0)
        os << " + " << s.squares[i].first << "/" << s.squares[i].second << " (" << symbols_[i] << " - " << lo_[i]
           << ")(" << symbols_[i] << " - " << hi_[i] << ")";
    os << "\n";
  }
  return os.str();
}

}  // namespace kiln
