// Reading the PLAN payload back into a verified Graph, and the WGTS payload into blobs.
// graph_codec.h says how the graph is rebuilt; engine_file.h gives the byte layout.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <variant>

#include "kiln/errors.h"
#include "src/common/parallel.h"  // parallel_for: the one thread pool
#include "src/serialize/graph_codec.h"

namespace kiln::serialize {

namespace {

// Smallest encodings, for checking counts against the bytes left before allocating.
constexpr size_t kMinValueBytes = 1 + 1 + 4 + 4;       // flags, dtype, rank, name length
constexpr size_t kMinDimBytes = 8 + 4 + 8 + 8;         // extent, symbol length, min, max
constexpr size_t kMinNodeBytes = 4 + 4 + 4 + 4 + 4 + 1;  // op, inputs, outputs, attrs, name, body flag
constexpr size_t kMinAttrBytes = 4 + 1 + 1;            // key length, kind, smallest payload
constexpr int64_t kMaxTensorBytes = int64_t(1) << 50;

struct StoredValue {
  TensorType type;
  std::string name;
  uint8_t flags = 0;
  uint64_t blob = 0;
};

struct StoredNode {
  OpKind op = OpKind::kCopy;
  std::vector<ValueId> inputs, outputs;
  Attrs attrs;
  std::string name;
  std::shared_ptr<Graph> body;
};

// Strips the "[code] " prefix Error adds, for re-wrapping a message under another code.
std::string message_of(const Error& e) {
  std::string s = e.what();
  size_t close = s.find("] ");
  return (!s.empty() && s[0] == '[' && close != std::string::npos) ? s.substr(close + 2) : s;
}

DType read_dtype(ByteReader& r) {
  uint8_t t = r.u8();
  if (t >= kNumDTypes) r.fail_corrupted(detail::concat("unknown dtype code ", int(t), " before offset ", r.offset()));
  return static_cast<DType>(t);
}

TensorType read_type(ByteReader& r) {
  TensorType t;
  t.dtype = read_dtype(r);
  uint64_t rank = r.count32(kMinDimBytes, "dimensions");
  t.dims.resize(rank);
  int64_t bytes = int64_t(dtype_size(t.dtype));
  for (Dim& d : t.dims) {
    d.extent = r.i64();
    d.symbol = r.str("a dimension's symbol");
    d.min = r.i64();
    d.max = r.i64();
    if (d.extent < 0 || (d.extent > 0 && bytes > kMaxTensorBytes / d.extent))
      r.fail_corrupted(detail::concat("impossible extent ", d.extent, " before offset ", r.offset()));
    bytes *= d.extent;
  }
  return t;
}

AttrValue read_attr(ByteReader& r, const std::string& key) {
  uint8_t kind = r.u8();
  switch (kind) {
    case 0: {
      uint8_t b = r.u8();
      if (b > 1) r.fail_corrupted(detail::concat("bool attribute '", key, "' holds ", int(b)));
      return AttrValue(b == 1);
    }
    case 1: return AttrValue(r.i64());
    case 2: return AttrValue(r.f64());
    case 3: return AttrValue(r.str("a string attribute"));
    case 4: {
      std::vector<int64_t> v(r.count32(8, "list elements"));
      for (int64_t& x : v) x = r.i64();
      return AttrValue(std::move(v));
    }
    case 5: {
      std::vector<double> v(r.count32(8, "list elements"));
      for (double& x : v) x = r.f64();
      return AttrValue(std::move(v));
    }
    case 6: return AttrValue(read_dtype(r));
    default: r.fail_corrupted(detail::concat("attribute '", key, "' has unknown kind ", int(kind)));
  }
}

std::vector<ValueId> read_ids(ByteReader& r, const char* what) {
  std::vector<ValueId> ids(r.count32(4, what));
  for (ValueId& v : ids) v = r.i32();
  return ids;
}

Graph read_graph_at(ByteReader& r, const std::vector<Blob>& blobs, int depth);

StoredNode read_node(ByteReader& r, const std::vector<Blob>& blobs, int depth, size_t index) {
  StoredNode n;
  std::string op = r.str("an op name");
  auto kind = op_from_name(op);
  if (!kind) r.fail_corrupted(detail::concat("unknown op '", op, "' in node ", index));
  n.op = *kind;
  n.inputs = read_ids(r, "node inputs");
  n.outputs = read_ids(r, "node outputs");
  uint64_t nattrs = r.count32(kMinAttrBytes, "attributes");
  for (uint64_t i = 0; i < nattrs; ++i) {
    std::string key = r.str("an attribute key");
    if (n.attrs.has(key)) r.fail_corrupted(detail::concat("node ", index, " (", op, ") repeats attribute '", key, "'"));
    n.attrs.set(key, read_attr(r, key));
  }
  n.name = r.str("a node name");
  uint8_t has_body = r.u8();
  if (has_body > 1) r.fail_corrupted(detail::concat("node ", index, " has body flag ", int(has_body)));
  if ((has_body == 1) != (n.op == OpKind::kFusedPointwise))
    r.fail_corrupted(detail::concat("node ", index, " (", op, ") ", has_body ? "has" : "lacks", " a body"));
  if (has_body) {
    if (depth + 1 > kMaxBodyDepth) r.fail_corrupted(detail::concat("fused bodies nest deeper than ", kMaxBodyDepth));
    n.body = std::make_shared<Graph>(read_graph_at(r, blobs, depth + 1));
  }
  return n;
}

// Fenwick tree over node indices: how many nodes stored before index k are already built,
// which is where node k goes in the graph being rebuilt.
class BuiltCounter {
 public:
  explicit BuiltCounter(size_t n) : t_(n + 1, 0) {}
  void mark(size_t k) {
    for (size_t i = k + 1; i < t_.size(); i += i & (~i + 1)) ++t_[i];
  }
  size_t before(size_t k) const {
    size_t s = 0;
    for (size_t i = k; i > 0; i -= i & (~i + 1)) s += t_[i];
    return s;
  }

 private:
  std::vector<size_t> t_;
};

// Checks that the stored pieces describe one graph; fills producer / output index per value.
void check_structure(ByteReader& r, const std::vector<StoredValue>& vals, const std::vector<StoredNode>& nodes,
                     const std::vector<ValueId>& ins, const std::vector<ValueId>& outs, size_t nblobs,
                     std::vector<int64_t>& producer, std::vector<int>& out_index) {
  const int64_t n = int64_t(vals.size());
  auto in_range = [&](ValueId v) { return v >= 0 && v < n; };
  producer.assign(vals.size(), -1);
  out_index.assign(vals.size(), 0);
  for (size_t k = 0; k < nodes.size(); ++k) {
    const StoredNode& node = nodes[k];
    const char* op = op_name(node.op);
    if (node.outputs.empty()) r.fail_corrupted(detail::concat("node ", k, " (", op, ") has no outputs"));
    for (ValueId in : node.inputs)
      if (in != kNoValue && !in_range(in))
        r.fail_corrupted(detail::concat("node ", k, " (", op, ") uses value id ", in, " of ", n));
    for (size_t j = 0; j < node.outputs.size(); ++j) {
      ValueId o = node.outputs[j];
      if (!in_range(o) || o != node.outputs[0] + ValueId(j))
        r.fail_corrupted(detail::concat("node ", k, " (", op, ") output ", j, " has id ", o));
      if (producer[o] >= 0 || (vals[o].flags & (kValueIsInput | kValueIsConstant)))
        r.fail_corrupted(detail::concat("value %", o, " is defined twice (node ", k, ")"));
      producer[o] = int64_t(k);
      out_index[o] = int(j);
    }
  }
  size_t flagged_inputs = 0;
  for (size_t v = 0; v < vals.size(); ++v) {
    uint8_t f = vals[v].flags;
    bool input = f & kValueIsInput, constant = f & kValueIsConstant, weight = f & kValueIsWeight;
    if ((f & ~7) || (input && constant) || (weight && !constant))
      r.fail_corrupted(detail::concat("value %", v, " has impossible flags ", int(f)));
    if (!input && !constant && producer[v] < 0) r.fail_corrupted(detail::concat("value %", v, " has no producer"));
    if (constant && vals[v].blob >= nblobs)
      r.fail_corrupted(detail::concat("constant %", v, " refers to blob ", vals[v].blob, " of ", nblobs));
    flagged_inputs += input;
  }
  if (flagged_inputs != ins.size())
    r.fail_corrupted(detail::concat(flagged_inputs, " values are inputs, the input list has ", ins.size()));
  for (size_t i = 0; i < ins.size(); ++i)
    if (!in_range(ins[i]) || !(vals[ins[i]].flags & kValueIsInput) || (i > 0 && ins[i] <= ins[i - 1]))
      r.fail_corrupted(detail::concat("graph input ", i, " has id ", ins[i]));
  for (size_t i = 0; i < outs.size(); ++i)
    if (!in_range(outs[i])) r.fail_corrupted(detail::concat("graph output ", i, " has id ", outs[i]));
}

Graph rebuild(ByteReader& r, const std::vector<StoredValue>& vals, const std::vector<StoredNode>& nodes,
              const std::vector<ValueId>& ins, const std::vector<ValueId>& outs, const std::vector<Blob>& blobs) {
  std::vector<int64_t> producer;
  std::vector<int> out_index;
  check_structure(r, vals, nodes, ins, outs, blobs.size(), producer, out_index);

  Graph g;
  std::vector<ValueId> built(vals.size(), kNoValue);
  BuiltCounter counter(nodes.size());
  struct Rewire {
    Node* node;
    size_t slot;
    ValueId stored;
  };
  std::vector<Rewire> rewires;
  auto stand_in = [&](ValueId stored) {
    const TensorType& t = vals[stored].type;
    ValueId p = g.add_constant("", TensorType(t.dtype, {}), std::make_shared<const HostBuffer>(dtype_size(t.dtype), 0));
    g.value(p).type = t;  // only its type is seen, by the shape rule; compact() drops it
    return p;
  };
  try {
    for (ValueId v = 0; v < ValueId(vals.size()); ++v) {
      const StoredValue& sv = vals[v];
      if (sv.flags & kValueIsInput) {
        built[v] = g.add_input(sv.name, sv.type);
      } else if (sv.flags & kValueIsConstant) {
        built[v] = g.add_constant(sv.name, sv.type, blobs[sv.blob], (sv.flags & kValueIsWeight) != 0);
      } else if (out_index[v] == 0) {
        size_t k = size_t(producer[v]);
        const StoredNode& sn = nodes[k];
        std::vector<ValueId> in;
        std::vector<Rewire> later;
        for (size_t s = 0; s < sn.inputs.size(); ++s) {
          ValueId x = sn.inputs[s];
          if (x == kNoValue || x < v) {
            in.push_back(x == kNoValue ? kNoValue : built[x]);
          } else {
            in.push_back(stand_in(x));
            later.push_back({nullptr, s, x});
          }
        }
        size_t pos = counter.before(k);
        std::vector<ValueId> made = sn.op == OpKind::kFusedPointwise
                                        ? g.insert_fused(pos, in, sn.body, sn.name, sn.attrs)
                                        : g.insert_node(pos, sn.op, in, sn.attrs, sn.name);
        Node* node = g.nodes()[pos].get();
        counter.mark(k);
        if (made.size() != sn.outputs.size())
          r.fail_corrupted(detail::concat("node ", k, " (", op_name(sn.op), ") makes ", made.size(),
                                          " outputs, the file lists ", sn.outputs.size()));
        for (size_t j = 0; j < made.size(); ++j) {
          built[sn.outputs[j]] = made[j];
          g.value(made[j]).name = vals[sn.outputs[j]].name;
        }
        for (Rewire& w : later) rewires.push_back({node, w.slot, w.stored});
      }
    }
    for (const Rewire& w : rewires) w.node->inputs[w.slot] = built[w.stored];
    for (ValueId o : outs) g.mark_output(built[o], vals[o].name);
    g.compact();
    if (size_t(g.num_values()) != vals.size())
      r.fail_corrupted(detail::concat("the plan stores ", vals.size(), " values, ", g.num_values(),
                                      " remain in use after rebuilding it"));
    // An empty graph is the refit program of an engine without derived constants; every plan
    // has outputs (Engine::create verifies it again).
    if (!g.outputs().empty() || !g.nodes().empty()) g.verify();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kCorrupted || e.code() == ErrorCode::kTruncated) throw;
    r.fail_corrupted("plan graph fails verification: " + message_of(e));
  }
  for (ValueId v = 0; v < g.num_values(); ++v) {
    const Value& got = g.value(v);
    const StoredValue& want = vals[v];
    uint8_t flags = (got.is_input ? kValueIsInput : 0) | (got.is_weight ? kValueIsWeight : 0) |
                    (got.is_constant() ? kValueIsConstant : 0);
    if (!(got.type == want.type))
      r.fail_corrupted(detail::concat("value %", v, " is stored as ", want.type.to_string(),
                                      ", its shape rule gives ", got.type.to_string()));
    if (got.name != want.name || flags != want.flags)
      r.fail_corrupted(detail::concat("value %", v, " '", want.name, "' does not rebuild to the stored value"));
  }
  return g;
}

Graph read_graph_at(ByteReader& r, const std::vector<Blob>& blobs, int depth) {
  std::vector<StoredValue> vals(r.count32(kMinValueBytes, "values"));
  for (StoredValue& sv : vals) {
    sv.flags = r.u8();
    sv.type = read_type(r);
    sv.name = r.str("a value name");
    if (sv.flags & kValueIsConstant) sv.blob = r.u64();
  }
  std::vector<StoredNode> nodes(r.count32(kMinNodeBytes, "nodes"));
  for (size_t k = 0; k < nodes.size(); ++k) nodes[k] = read_node(r, blobs, depth, k);
  std::vector<ValueId> ins = read_ids(r, "graph inputs");
  std::vector<ValueId> outs = read_ids(r, "graph outputs");
  return rebuild(r, vals, nodes, ins, outs, blobs);
}

}  // namespace

std::vector<Blob> read_blobs(ByteReader& r, const std::shared_ptr<void>& owner) {
  std::vector<Blob> blobs(r.count64(8, "blobs"));
  std::vector<std::pair<const uint8_t*, size_t>> spans;
  size_t total = 0;
  for (size_t i = 0; i < blobs.size(); ++i) {
    uint64_t size = r.u64();
    r.align(kBlobAlignment);
    spans.emplace_back(r.take(size), size);
    total += size;
  }
  if (owner) {
    for (size_t i = 0; i < blobs.size(); ++i)
      blobs[i] = std::make_shared<HostBuffer>(owner, const_cast<uint8_t*>(spans[i].first), spans[i].second);
    return blobs;
  }
  // Copying the weights into fresh memory is mostly page faults (clearing the new pages): for
  // large engines the copies run on up to 8 threads of the CPU pool, each taking whole blobs,
  // largest first to the least loaded share.
  constexpr size_t kParallelBytes = size_t(32) << 20;
  const size_t shares = total < kParallelBytes ? 1 : std::min<size_t>({8, blobs.size(), size_t(num_threads())});
  std::vector<std::vector<size_t>> share(shares);
  std::vector<size_t> load(share.size(), 0), order(blobs.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return spans[a].second > spans[b].second; });
  for (size_t i : order) {
    const size_t t = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    share[t].push_back(i);
    load[t] += spans[i].second;
  }
  parallel_for(int64_t(share.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (size_t i : share[size_t(t)])  // not const: a refittable engine may own and rewrite it
        blobs[i] = std::make_shared<HostBuffer>(spans[i].first, spans[i].first + spans[i].second);
  });
  return blobs;
}

Graph read_graph(ByteReader& r, const std::vector<Blob>& blobs) { return read_graph_at(r, blobs, 0); }

}  // namespace kiln::serialize
