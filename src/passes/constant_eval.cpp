// The constant evaluator of fold_constants and the Refitter (see constant_eval.h).
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "kiln/backend.h"
#include "kiln/errors.h"
#include "src/common/parallel.h"
#include "src/ops/pointwise.h"
#include "src/passes/constant_eval.h"

namespace kiln::passes {

namespace {

// An elementwise node evaluate_program evaluates itself, tile by tile, without materializing its
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
  struct Leaf {
    const uint8_t* base;
    std::vector<int64_t> outer_stride;
    int64_t inner_stride;
    size_t esize;
  };
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
          else if (to == DType::kF16 || to == DType::kBF16) cast_to_half(from, to, a, static_cast<uint16_t*>(y), len);
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

bool evaluate_constant_node(const Graph& g, const Node& n, std::vector<std::shared_ptr<HostBuffer>>& results) {
  Backend& cpu = get_backend(Device{});
  std::unique_ptr<Kernel> kernel;
  try {
    kernel = cpu.make_kernel(n, g, KernelOptions{});
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kUnsupported) return false;
    throw;
  }
  KILN_CHECK(kernel != nullptr, kInternal, "no CPU kernel for ", op_name(n.op));

  std::vector<const void*> ins;
  for (ValueId in : n.inputs) {
    KILN_CHECK(in == kNoValue || g.value(in).is_constant(), kInternal, "evaluating ", op_name(n.op), ": input %", in,
               " is not a constant");
    ins.push_back(in == kNoValue ? nullptr : g.value(in).data->data());
  }
  results.clear();
  std::vector<void*> outs;
  for (ValueId out : n.outputs) {
    results.push_back(std::make_shared<HostBuffer>(g.type(out).nbytes()));
    outs.push_back(results.back()->data());
  }
  RunContext rc;
  std::shared_ptr<void> workspace;
  if (size_t ws = kernel->workspace_size()) {
    workspace = cpu.allocate(ws);
    rc.workspace = workspace.get();
    rc.workspace_size = ws;
  }
  kernel->run(ins.data(), outs.data(), rc);
  return true;
}

ProgramOutputs evaluate_program(const Graph& program, const std::vector<ProgramInput>& inputs,
                                const std::vector<char>& wanted, const std::vector<uint8_t*>& in_place) {
  const auto& outputs = program.outputs();
  KILN_CHECK(inputs.size() == program.inputs().size() && wanted.size() == outputs.size() &&
                 (in_place.empty() || in_place.size() == outputs.size()),
             kInternal, "evaluating a program of ", program.inputs().size(), " inputs and ", outputs.size(),
             " outputs: ", inputs.size(), " inputs, ", wanted.size(), " output flags, ", in_place.size(),
             " output buffers");
  // The values the wanted outputs depend on, and the nodes that compute them.
  const size_t nv = size_t(program.num_values());
  std::vector<char> needed(nv, 0);
  for (size_t i = 0; i < outputs.size(); ++i)
    if (wanted[i]) needed[size_t(outputs[i])] = 1;
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
  for (size_t i = 0; i < outputs.size(); ++i)
    if (output_index[size_t(outputs[i])] < 0) output_index[size_t(outputs[i])] = int(i);
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
  // whose inputs are constants, as fold_constants saw it. Inputs given as views are read in place.
  std::vector<const uint8_t*> ptr(nv, nullptr);
  std::vector<std::shared_ptr<const HostBuffer>> value(nv);  // where the bytes are owned by a HostBuffer
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ValueId in = program.inputs()[i];
    if (!needed[size_t(in)]) continue;
    value[size_t(in)] = inputs[i].owned;
    ptr[size_t(in)] = inputs[i].bytes();
    KILN_CHECK(ptr[size_t(in)] != nullptr || program.type(in).nbytes() == 0, kInternal, "program input '",
               program.value(in).name, "' has no bytes");
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
    KILN_CHECK(evaluate_constant_node(one, *one.nodes().back(), results), kInternal, "refit: no CPU kernel for ",
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
    const int oi = output_index[size_t(out)];
    uint8_t* dst = oi >= 0 && !in_place.empty() ? in_place[size_t(oi)] : nullptr;  // straight into the caller's bytes
    if (!dst) {
      auto buffer = std::make_shared<HostBuffer>(program.type(out).nbytes());
      dst = buffer->data();
      value[size_t(out)] = std::move(buffer);
    }
    ptr[size_t(out)] = dst;
    run_group(program, members, ptr, dst);
  }

  ProgramOutputs result;
  for (size_t i = 0; i < outputs.size(); ++i) result.bytes.push_back(wanted[i] ? ptr[size_t(outputs[i])] : nullptr);
  result.buffers = std::move(value);
  return result;
}

}  // namespace kiln::passes
