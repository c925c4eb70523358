// Refitter: new weights by name -> the refit program re-derives what the builder folded ->
// the engine's constants are overwritten in place (see include/kiln/refit.h).
#include <algorithm>
#include <cstring>
#include <set>
#include <unordered_set>

#include "kiln/errors.h"
#include "kiln/refit.h"
#include "src/common/parallel.h"
#include "src/common/stopwatch.h"
#include "src/ops/pointwise.h"
#include "src/passes/refit_record.h"

namespace kiln {

namespace {

const Value* plan_weight(const Graph& plan, const std::string& name) {
  for (ValueId c : plan.constants())
    if (plan.value(c).is_weight && plan.value(c).name == name) return &plan.value(c);
  return nullptr;
}

ValueId program_input(const Graph& program, const std::string& name) {
  for (ValueId in : program.inputs())
    if (program.value(in).name == name) return in;
  return kNoValue;
}

// The program inputs each program value depends on (by name), for the values `wanted`.
std::set<std::string> inputs_feeding(const Graph& program, const std::vector<ValueId>& wanted) {
  std::set<std::string> names;
  std::vector<char> seen(size_t(program.num_values()), 0);
  std::vector<ValueId> stack(wanted.begin(), wanted.end());
  while (!stack.empty()) {
    ValueId v = stack.back();
    stack.pop_back();
    if (v == kNoValue || seen[size_t(v)]) continue;
    seen[size_t(v)] = 1;
    const Value& val = program.value(v);
    if (val.is_input) names.insert(val.name);
    if (val.producer)
      for (ValueId in : val.producer->inputs) stack.push_back(in);
  }
  return names;
}

// An elementwise node the refit evaluates itself, tile by tile, without materializing its
// intermediates: a cast from f32 or f64 to f32, f64, f16 or bf16 (the precision casts of an
// f16 engine), or add / sub / mul / div on f32 or f64 (inputs of the output's dtype,
// broadcast to its shape). Each element goes through the same scalar operations as the CPU
// kernels (a static_cast, pw::Elem<>::store; pw::binary_array), so the bits are the same. An
// f16 / bf16 value feeds no fusable node, so such a cast is always the root of its group.
bool fusable(const Graph& p, const Node& n) {
  if (n.body || n.outputs.size() != 1) return false;
  const DType out = p.type(n.outputs[0]).dtype;
  auto real = [](DType d) { return d == DType::kF32 || d == DType::kF64; };
  if (n.op == OpKind::kCast)
    return (real(out) || out == DType::kF16 || out == DType::kBF16) && n.inputs.size() == 1 &&
           n.inputs[0] != kNoValue && real(p.type(n.inputs[0]).dtype) &&
           p.type(n.inputs[0]).shape() == p.type(n.outputs[0]).shape();
  if (!real(out)) return false;
  if (n.op != OpKind::kAdd && n.op != OpKind::kSub && n.op != OpKind::kMul && n.op != OpKind::kDiv) return false;
  if (n.inputs.size() != 2) return false;
  const auto& os = p.type(n.outputs[0]).shape();
  for (ValueId in : n.inputs) {
    if (in == kNoValue || p.type(in).dtype != out) return false;
    const auto& is = p.type(in).shape();
    if (is.size() > os.size()) return false;
    for (size_t j = 0; j < is.size(); ++j) {
      const int64_t d = is[is.size() - 1 - j];
      if (d != 1 && d != os[os.size() - 1 - j]) return false;
    }
  }
  return true;
}

// y[0, n) = x cast from f32 / f64 to f16 / bf16, as the CPU cast kernel does (f64 rounds
// through f32).
void cast_to_half(DType from, DType to, const void* x, uint16_t* y, int64_t n) {
  auto run = [&](auto store) {
    if (from == DType::kF32)
      for (int64_t e = 0; e < n; ++e) y[e] = store(static_cast<const float*>(x)[e]);
    else
      for (int64_t e = 0; e < n; ++e) y[e] = store(static_cast<float>(static_cast<const double*>(x)[e]));
  };
  if (to == DType::kF16) run([](float v) { return pw::Elem<DType::kF16>::store(v); });
  else run([](float v) { return pw::Elem<DType::kBF16>::store(v); });
}

// Fused elementwise groups smaller than this are evaluated node by node.
constexpr int64_t kFuseMinElements = 4096;

// One fused group: `members` (program node indices, in order; the last is the root) computed
// tile by tile (up to kTile elements of a row) into `out` (the root's output, `rows` x `row`
// elements).
void run_group(const Graph& p, const std::vector<const Node*>& members, const std::vector<const uint8_t*>& ptr,
               uint8_t* out) {
  const Node& root = *members.back();
  const auto root_shape = p.type(root.outputs[0]).shape();
  const std::vector<int64_t> dims(root_shape.begin(), root_shape.end());
  const int r = int(dims.size());
  std::unordered_map<ValueId, int> member_of;  // internal value -> member index
  for (size_t m = 0; m < members.size(); ++m) member_of[members[m]->outputs[0]] = int(m);
  // Leaves: for each, the smallest k such that its dims k..r-1 are all the output's or all 1.
  struct Leaf { const uint8_t* base; std::vector<int64_t> outer_stride; int64_t inner_stride; size_t esize; };
  std::unordered_map<ValueId, Leaf> leaves;
  int k = r;
  std::vector<std::pair<ValueId, int>> leaf_k;
  for (const Node* n : members)
    for (ValueId in : n->inputs) {
      if (member_of.count(in) || leaves.count(in)) continue;
      std::vector<int64_t> s(size_t(r), 1);
      const auto& is = p.type(in).shape();
      for (size_t j = 0; j < is.size(); ++j) s[size_t(r) - is.size() + j] = is[j];
      int kf = r, kb = r;
      while (kf > 0 && s[size_t(kf - 1)] == dims[size_t(kf - 1)]) --kf;
      while (kb > 0 && s[size_t(kb - 1)] == 1) --kb;
      leaf_k.emplace_back(in, std::min(kf, kb));
      leaves[in] = Leaf{ptr[size_t(in)], {}, 0, dtype_size(p.type(in).dtype)};
      leaves[in].outer_stride = s;  // the padded shape for now
    }
  k = 0;
  for (const auto& lk : leaf_k) k = std::max(k, lk.second);
  int64_t row = 1, rows = 1;
  for (int j = k; j < r; ++j) row *= dims[size_t(j)];
  for (int j = 0; j < k; ++j) rows *= dims[size_t(j)];
  for (auto& [v, leaf] : leaves) {
    const std::vector<int64_t> s = leaf.outer_stride;
    bool full = true;
    for (int j = k; j < r; ++j) full = full && s[size_t(j)] == dims[size_t(j)];
    leaf.inner_stride = full ? 1 : 0;
    std::vector<int64_t> st(size_t(k), 0);
    int64_t acc = 1;
    for (int j = r - 1; j >= 0; --j) {
      if (j < k) st[size_t(j)] = s[size_t(j)] == 1 ? 0 : acc;
      acc *= s[size_t(j)];
    }
    leaf.outer_stride = std::move(st);
  }
  const size_t out_size = dtype_size(p.type(root.outputs[0]).dtype);
  // Tiles of at most kTile elements of a row (the operands are dense or constant along a row),
  // so that a tensor that is one long row still spreads over the threads.
  constexpr int64_t kTile = 16384;
  const int64_t tiles_per_row = std::max<int64_t>(1, (row + kTile - 1) / kTile);
  const int64_t tile = std::min(row, kTile);
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(tile, 1));
  parallel_for(rows * tiles_per_row, grain, [&](int64_t begin, int64_t end) {
    std::vector<std::vector<double>> buf(members.size(), std::vector<double>(size_t(tile)));
    std::vector<int64_t> idx(static_cast<size_t>(k));
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t / tiles_per_row, c0 = (t % tiles_per_row) * kTile, len = std::min(row - c0, kTile);
      int64_t rem = i;
      for (int j = k - 1; j >= 0; --j) {
        idx[size_t(j)] = rem % dims[size_t(j)];
        rem /= dims[size_t(j)];
      }
      auto operand = [&](ValueId v, int64_t& stride) -> const void* {
        auto m = member_of.find(v);
        if (m != member_of.end()) {
          stride = 1;
          return buf[size_t(m->second)].data();
        }
        const Leaf& leaf = leaves.at(v);
        int64_t off = c0 * leaf.inner_stride;
        for (int j = 0; j < k; ++j) off += idx[size_t(j)] * leaf.outer_stride[size_t(j)];
        stride = leaf.inner_stride;
        return leaf.base + size_t(off) * leaf.esize;
      };
      for (size_t m = 0; m < members.size(); ++m) {
        const Node& n = *members[m];
        void* y = m + 1 == members.size() ? static_cast<void*>(out + size_t(i * row + c0) * out_size) : buf[m].data();
        const DType to = p.type(n.outputs[0]).dtype;
        int64_t sa = 1, sb = 1;
        const void* a = operand(n.inputs[0], sa);
        if (n.op == OpKind::kCast) {
          const DType from = p.type(n.inputs[0]).dtype;
          if (from == to) std::memcpy(y, a, size_t(len) * dtype_size(to));
          else if (to == DType::kF16 || to == DType::kBF16)
            cast_to_half(from, to, a, static_cast<uint16_t*>(y), len);
          else if (from == DType::kF32)
            for (int64_t e = 0; e < len; ++e)
              static_cast<double*>(y)[e] = static_cast<double>(static_cast<const float*>(a)[e]);
          else
            for (int64_t e = 0; e < len; ++e)
              static_cast<float*>(y)[e] = static_cast<float>(static_cast<const double*>(a)[e]);
          continue;
        }
        const void* b = operand(n.inputs[1], sb);
        if (to == DType::kF32)
          pw::binary_array<float>(n.op, static_cast<const float*>(a), sa, static_cast<const float*>(b), sb,
                                  static_cast<float*>(y), len);
        else
          pw::binary_array<double>(n.op, static_cast<const double*>(a), sa, static_cast<const double*>(b), sb,
                                   static_cast<double*>(y), len);
      }
    }
  });
}

}  // namespace

Refitter::Refitter(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {
  KILN_CHECK(engine_ != nullptr, kInvalidArgument, "Refitter needs an engine");
  KILN_CHECK(engine_->refittable(), kUnsupported,
             "this engine cannot be refitted: it was built with immutable weights (BuilderConfig.refittable = "
             "false, Kiln setting immutable_weights=True) or loaded from an engine file without a refit program; "
             "build it refittable to change its weights");
}

std::vector<std::string> Refitter::weight_names() const {
  std::vector<std::string> names = engine_->weight_names();
  for (ValueId in : engine_->refit_program_->inputs()) names.push_back(engine_->refit_program_->value(in).name);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

TensorType Refitter::weight_type(const std::string& name) const {
  if (const Value* w = plan_weight(engine_->plan_, name)) return w->type;
  const Graph& program = *engine_->refit_program_;
  ValueId in = program_input(program, name);
  if (in != kNoValue) return program.type(in);
  const std::vector<std::string> names = weight_names();
  std::string some;
  for (size_t i = 0; i < names.size() && i < 5; ++i) some += (i ? ", '" : "'") + names[i] + "'";
  KILN_FAIL(kInvalidArgument, "the engine has no weight named '", name, "' (it has ", names.size(), " weights",
            names.empty() ? "" : ": ", some, names.size() > 5 ? ", ..." : "", ")");
}

void Refitter::check_weight(const std::string& name, const TensorType& type, const void* host_data) const {
  const TensorType want = weight_type(name);
  KILN_CHECK(type.dtype == want.dtype, kInvalidArgument, "weight '", name, "' must be ", dtype_name(want.dtype),
             " (", want.to_string(), "), got ", dtype_name(type.dtype));
  KILN_CHECK(type.shape() == want.shape(), kInvalidArgument, "weight '", name, "' must have shape ",
             want.to_string(), ", got ", type.to_string());
  KILN_CHECK(host_data != nullptr || want.nbytes() == 0, kInvalidArgument, "weight '", name, "' has no data");
}

void Refitter::set_weight(const std::string& name, const TensorType& type, const void* host_data) {
  check_weight(name, type, host_data);
  auto bytes = std::make_shared<HostBuffer>(type.nbytes());
  if (!bytes->empty()) std::memcpy(bytes->data(), host_data, bytes->size());
  Pending p;
  p.size = bytes->size();
  p.owned = std::move(bytes);
  pending_[name] = std::move(p);
}

void Refitter::set_weight_view(const std::string& name, const TensorType& type, const void* host_data) {
  check_weight(name, type, host_data);
  Pending p;
  p.view = host_data;
  p.size = type.nbytes();
  pending_[name] = std::move(p);
}

std::vector<std::string> Refitter::missing_weights() const {
  const Graph& program = *engine_->refit_program_;
  std::vector<ValueId> affected;
  for (ValueId out : program.outputs()) {
    std::set<std::string> feeding = inputs_feeding(program, {out});
    for (const std::string& n : feeding)
      if (pending_.count(n)) {
        affected.push_back(out);
        break;
      }
  }
  std::vector<std::string> missing;
  for (const std::string& n : inputs_feeding(program, affected))
    if (!pending_.count(n) && !plan_weight(engine_->plan_, n)) missing.push_back(n);
  return missing;
}

void Refitter::refit() {
  const std::vector<std::string> missing = missing_weights();
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size(); ++i) list += (i ? ", '" : "'") + missing[i] + "'";
    KILN_FAIL(kInvalidArgument, "refit needs weight(s) ", list, " as well: the engine derives constants from them "
              "together with the weights given, and keeps no copy of them");
  }
  Stopwatch watch;  // each part's time, for report()
  Engine& e = *engine_;
  Graph& plan = e.plan_;
  const Graph& program = *e.refit_program_;

  // Which program outputs change, and the nodes that compute them.
  const size_t nv = size_t(program.num_values());
  std::vector<char> changed(nv, 0), needed(nv, 0);
  for (ValueId in : program.inputs()) changed[size_t(in)] = pending_.count(program.value(in).name) != 0;
  for (const auto& node : program.nodes()) {
    bool c = false;
    for (ValueId in : node->inputs) c = c || (in != kNoValue && changed[size_t(in)]);
    for (ValueId out : node->outputs) changed[size_t(out)] = c;
  }
  for (ValueId out : program.outputs()) needed[size_t(out)] = changed[size_t(out)];
  for (size_t i = program.nodes().size(); i-- > 0;) {
    const Node& node = *program.nodes()[i];
    bool any = false;
    for (ValueId out : node.outputs) any = any || needed[size_t(out)];
    if (any)
      for (ValueId in : node.inputs)
        if (in != kNoValue) needed[size_t(in)] = 1;
  }

  // Which values the fused elementwise groups keep internal (computed tile by tile inside the
  // group of their one consumer, never materialized), and where each program output is written.
  const auto& nodes = program.nodes();
  std::vector<int> producer(nv, -1), consumers(nv, 0), consumer(nv, -1);
  std::vector<int> output_index(nv, -1);
  for (size_t i = 0; i < program.outputs().size(); ++i)
    if (output_index[size_t(program.outputs()[i])] < 0) output_index[size_t(program.outputs()[i])] = int(i);
  std::vector<char> node_needed(nodes.size(), 0), is_fusable(nodes.size(), 0), internal(nv, 0);
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (ValueId out : nodes[i]->outputs) {
      producer[size_t(out)] = int(i);
      node_needed[i] = node_needed[i] || needed[size_t(out)];
    }
    if (!node_needed[i]) continue;
    is_fusable[i] = fusable(program, *nodes[i]);
    for (ValueId in : nodes[i]->inputs)
      if (in != kNoValue) {
        ++consumers[size_t(in)];
        consumer[size_t(in)] = int(i);
      }
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!is_fusable[i]) continue;
    const ValueId out = nodes[i]->outputs[0];
    const int c = consumer[size_t(out)];
    internal[size_t(out)] = consumers[size_t(out)] == 1 && output_index[size_t(out)] < 0 && c >= 0 &&
                            is_fusable[size_t(c)] &&
                            program.type(nodes[size_t(c)]->outputs[0]).shape() == program.type(out).shape();
  }

  // Evaluate in program order: fused groups at their root, every other node alone in a graph
  // whose inputs are constants, as fold_constants saw it. Weights given as views are read in place.
  std::vector<const uint8_t*> ptr(nv, nullptr);
  std::vector<std::shared_ptr<const HostBuffer>> value(nv);  // where the bytes are owned by a HostBuffer
  for (ValueId in : program.inputs()) {
    if (!needed[size_t(in)]) continue;
    auto p = pending_.find(program.value(in).name);
    if (p == pending_.end()) value[size_t(in)] = plan_weight(plan, program.value(in).name)->data;
    else value[size_t(in)] = p->second.owned;
    ptr[size_t(in)] = value[size_t(in)] ? value[size_t(in)]->data() : p->second.bytes();
  }
  for (ValueId c : program.constants()) {
    value[size_t(c)] = program.value(c).data;
    ptr[size_t(c)] = value[size_t(c)] ? value[size_t(c)]->data() : nullptr;
  }
  auto bytes_of = [&](ValueId v) {
    if (!value[size_t(v)]) {  // a view the node-by-node path reads: copy it once
      const size_t size = program.type(v).nbytes();
      value[size_t(v)] = std::make_shared<HostBuffer>(ptr[size_t(v)], ptr[size_t(v)] + size);
      ptr[size_t(v)] = value[size_t(v)]->data();
    }
    return value[size_t(v)];
  };
  std::vector<std::shared_ptr<HostBuffer>> results;
  auto run_alone = [&](const Node& node) {
    Graph one;
    std::vector<ValueId> ins;
    for (ValueId in : node.inputs)
      ins.push_back(in == kNoValue ? kNoValue : one.add_constant("", program.type(in), bytes_of(in)));
    if (node.body) one.insert_fused(0, ins, node.body, node.name);
    else one.add_node(node.op, ins, node.attrs, node.name);
    KILN_CHECK(passes::evaluate_constant_node(one, *one.nodes().back(), results), kInternal, "refit: no CPU kernel for ",
               op_name(node.op));
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      value[size_t(node.outputs[k])] = std::move(results[k]);
      ptr[size_t(node.outputs[k])] = value[size_t(node.outputs[k])]->data();
    }
  };
  std::vector<const Node*> members;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!node_needed[i]) continue;
    const Node& node = *nodes[i];
    if (is_fusable[i] && internal[size_t(node.outputs[0])]) continue;  // evaluated with its consumer
    if (!is_fusable[i] || program.type(node.outputs[0]).numel() < kFuseMinElements) {
      // Internal inputs of a node not fused after all (a small group): evaluate them first.
      std::vector<size_t> late;
      std::vector<ValueId> stack;
      for (ValueId in : node.inputs)
        if (in != kNoValue && internal[size_t(in)]) stack.push_back(in);
      while (!stack.empty()) {
        const ValueId v = stack.back();
        stack.pop_back();
        late.push_back(size_t(producer[size_t(v)]));
        for (ValueId in : nodes[size_t(producer[size_t(v)])]->inputs)
          if (in != kNoValue && internal[size_t(in)]) stack.push_back(in);
      }
      std::sort(late.begin(), late.end());
      for (size_t j : late) run_alone(*nodes[j]);
      run_alone(node);
      continue;
    }
    // A fused group rooted here: its members are the internal values' producers, in order.
    std::vector<size_t> group{i};
    std::vector<ValueId> stack;
    for (ValueId in : node.inputs)
      if (internal[size_t(in)]) stack.push_back(in);
    while (!stack.empty()) {
      const ValueId v = stack.back();
      stack.pop_back();
      group.push_back(size_t(producer[size_t(v)]));
      for (ValueId in : nodes[size_t(producer[size_t(v)])]->inputs)
        if (internal[size_t(in)]) stack.push_back(in);
    }
    std::sort(group.begin(), group.end());
    members.clear();
    for (size_t j : group) members.push_back(nodes[j].get());
    const ValueId out = node.outputs[0];
    const size_t size = program.type(out).nbytes();
    const int oi = output_index[size_t(out)];
    if (oi >= 0 && e.refit_targets_[size_t(oi)]->data && e.refit_targets_[size_t(oi)]->data->size() == size) {
      // Straight into the engine's constant (written below only where it is another buffer).
      ptr[size_t(out)] = const_cast<HostBuffer*>(e.refit_targets_[size_t(oi)]->data.get())->data();
    } else {
      auto buffer = std::make_shared<HostBuffer>(size);
      ptr[size_t(out)] = buffer->data();
      value[size_t(out)] = std::move(buffer);
    }
    run_group(program, members, ptr, const_cast<uint8_t*>(ptr[size_t(out)]));
  }

  const double program_ms = watch.lap();
  // Write in place: the plan's (engine-owned) host bytes, and the device copy where there is one.
  Backend& be = *e.backend_;
  const bool on_host = e.device_.type == DeviceType::kCPU;
  std::unordered_set<const HostBuffer*> written;
  auto write = [&](const Value& target, const uint8_t* src, size_t size) {
    KILN_CHECK(target.data && target.data->size() == size, kInternal, "refit: constant '", target.name,
               "' holds ", target.data ? target.data->size() : 0, " bytes, its new value ", size);
    auto* dst = const_cast<HostBuffer*>(target.data.get());  // the engine's own copy (Engine::create)
    if (size && dst->data() != src) std::memcpy(dst->data(), src, size);
    written.insert(dst);
  };
  for (ValueId c : plan.constants())
    if (plan.value(c).is_weight) {
      auto p = pending_.find(plan.value(c).name);
      if (p != pending_.end()) write(plan.value(c), p->second.bytes(), p->second.size);
    }
  size_t outputs_changed = 0;
  for (size_t i = 0; i < program.outputs().size(); ++i) {
    ValueId out = program.outputs()[i];
    if (!changed[size_t(out)]) continue;
    write(*e.refit_targets_[i], ptr[size_t(out)], program.type(out).nbytes());
    ++outputs_changed;
  }
  const double write_ms = watch.lap();
  if (!on_host) be.synchronize(nullptr);  // a forward still running on any stream reads the old values, whole
  // A weight read in place from its owner's memory is never written there: it becomes the
  // engine's own, with its new bytes (contexts take its new address on their next call).
  std::unordered_set<ValueId> moved;
  for (ValueId c : plan.constants())
    if (written.count(plan.value(c).data.get()) && e.borrowed_[size_t(c)]) {
      e.stop_borrowing(c);
      moved.insert(c);
    }
  if (!on_host) {
    std::vector<Backend::HostCopy> copies;
    for (ValueId c : plan.constants())
      if (written.count(plan.value(c).data.get()) && e.constant_ptr_[size_t(c)] && !moved.count(c))
        copies.push_back({const_cast<void*>(e.constant_ptr_[size_t(c)]), plan.value(c).data->data(),
                          plan.value(c).data->size()});
    be.upload(copies);
  }

  const double copy_ms = watch.lap();
  int remade = 0;
  // Kernels that may have read a written constant when they were made are made again.
  for (size_t i = 0; i < plan.nodes().size(); ++i) {
    const Node& n = *plan.nodes()[i];
    bool reads = false;
    for (ValueId in : n.inputs)
      reads = reads || (in != kNoValue && plan.value(in).is_constant() && written.count(plan.value(in).data.get()));
    if (n.body)
      for (ValueId c : n.body->constants()) reads = reads || written.count(n.body->value(c).data.get());
    if (!reads || !e.kernels_[i]->bakes_constants()) continue;
    auto k = be.make_kernel(n, plan, e.options_, &e.kernel_states_[i]);
    KILN_CHECK(k != nullptr && k->workspace_size() <= e.workspace_, kInternal, "refit: the kernel of ",
               op_name(n.op), " made again needs more workspace than the engine has");
    e.kernels_[i] = std::move(k);
    ++remade;
  }
  auto fmt = [](double ms) { return detail::concat(tenths(ms), " ms"); };
  report_ = detail::concat("refit: ", pending_.size(), " weights, program ", fmt(program_ms), " (", outputs_changed,
                           " outputs), host writes ", fmt(write_ms), on_host ? "" : ", device copies ",
                           on_host ? "" : fmt(copy_ms), ", ", remade, " kernels remade in ", fmt(watch.ms()));
  ++e.weights_version_;
  e.source_weights_id_.clear();
  pending_.clear();
}

}  // namespace kiln
