// Pointwise programs (what a unary / binary / where / cast / fused_pointwise node computes)
// and their layouts; the CUDA source text is written by pointwise_source.cpp.
//
// The semantics follow src/ops/pointwise.h and the CPU kernels: integer add/sub/mul/neg/abs
// wrap, integer div truncates with x / 0 == 0, integer clamp bounds round inward (int_bound),
// maximum / minimum propagate NaN from either side, casts truncate toward zero saturating at
// the i64 range (NaN -> 0) and then wrap, comparisons and logical ops give bool.
#include <algorithm>
#include <array>
#include <cstring>

#include "src/backends/cuda/codegen/pointwise_program.h"
#include "src/common/element_access.h"
#include "src/ops/access.h"
#include "src/ops/shape_rules.h"

namespace kiln::cuda::pwgen {

namespace {

// A one-element constant's value: floating dtypes as double, the others as int64.
void read_constant(const Value& v, double* f, int64_t* i) {
  const uint8_t* p = v.data->data();
  switch (v.type.dtype) {
    case DType::kF32: {
      float x;
      std::memcpy(&x, p, 4);
      *f = x;
      return;
    }
    case DType::kF64: {
      double x;
      std::memcpy(&x, p, 8);
      *f = x;
      return;
    }
    case DType::kF16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      *f = half_to_float(x);
      return;
    }
    case DType::kBF16: {
      uint16_t x;
      std::memcpy(&x, p, 2);
      *f = bf16_to_float(x);
      return;
    }
    case DType::kI64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      *i = x;
      return;
    }
    case DType::kI32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      *i = x;
      return;
    }
    case DType::kI8: {
      int8_t x;
      std::memcpy(&x, p, 1);
      *i = x;
      return;
    }
    case DType::kU8: *i = p[0]; return;
    case DType::kBool: *i = p[0] != 0; return;
  }
}

bool fail(std::string* why, const std::string& msg) {
  if (why) *why = msg;
  return false;
}

// Whether the generator has code for `op` on inputs of dtype `in` (the shape rules already
// restrict dtypes; this guards bodies built by hand).
bool op_supported(OpKind op, DType in, std::string* why) {
  const OpFamily fam = op_info(op).family;
  if (op == OpKind::kCopy || fam == OpFamily::kCast || fam == OpFamily::kWhere) return true;
  if (fam == OpFamily::kUnary) {
    if (is_floating(in) || op == OpKind::kLogicalNot) return true;
    const bool int_ok =
        op == OpKind::kRelu || op == OpKind::kNeg || op == OpKind::kAbs || op == OpKind::kClamp || op == OpKind::kSign;
    if (int_ok && in != DType::kBool) return true;
    return fail(why, std::string(op_name(op)) + " on " + dtype_name(in) + " has no CUDA kernel (floating only)");
  }
  if (fam == OpFamily::kBinary) {
    const bool arith = op == OpKind::kAdd || op == OpKind::kSub || op == OpKind::kMul || op == OpKind::kDiv ||
                       op == OpKind::kMaximum || op == OpKind::kMinimum || op == OpKind::kPow;
    if (arith && in == DType::kBool) return fail(why, std::string(op_name(op)) + " on bool has no CUDA kernel");
    if (op == OpKind::kPow && !is_floating(in))
      return fail(why, std::string("pow on ") + dtype_name(in) + " has no CUDA kernel (floating only)");
    return true;
  }
  return fail(why, std::string(op_name(op)) + " is not a pointwise op");
}

// Why index_select `s` of n's body cannot be a gathered leaf, or "": its data and index must be
// node inputs, the index a constant 1-D i64 / i32 tensor of the graph with every value in range
// (the kernel does not check), and its result must broadcast to `group` (its part's shape).
std::string gather_refusal(const Node& n, const Graph& g, const Node& s, const std::vector<int64_t>& group) {
  const Graph& body = *n.body;
  const int data = pw::input_position(body, s.inputs[0]), index = pw::input_position(body, s.inputs[1]);
  if (data < 0 || index < 0) return "fused_pointwise body index_select reads a value computed in the body";
  const Value& iv = g.value(n.inputs[size_t(index)]);
  if (!iv.is_constant() || iv.type.rank() != 1 || (iv.type.dtype != DType::kI64 && iv.type.dtype != DType::kI32))
    return "fused_pointwise body index_select needs a constant 1-D i64 / i32 index";
  const int64_t dim = body.type(s.inputs[0]).dims[size_t(s.attrs.get_int("axis"))].extent;
  for (int64_t k = 0; k < iv.type.numel(); ++k) {
    const int64_t v = load_index(iv.data->data(), iv.type.dtype, k);
    if (v < -dim || v >= dim)
      return "fused_pointwise body index_select index " + std::to_string(v) + " is out of range for a dim of " +
             std::to_string(dim);
  }
  if (!broadcasts_to(pw::gathered_shape(body, s), group))
    return "fused_pointwise body index_select gives a shape that does not broadcast to the group shape";
  return "";
}

int count_gathers(const Graph& body) {
  int n = 0;
  for (const auto& node : body.nodes()) n += node->op == OpKind::kIndexSelect;
  return n;
}

// Per input of a fused node: whether only its body's index_select nodes read it.
std::vector<uint8_t> pointer_only_inputs(const Node& n) {
  if (n.op != OpKind::kFusedPointwise || !n.body) return std::vector<uint8_t>(n.inputs.size(), 0);
  const std::vector<char> only = pw::gather_only_inputs(*n.body);
  return std::vector<uint8_t>(only.begin(), only.end());
}

// The parts of n's body when it ends in a concat (pw::concat_body), else nullopt.
std::optional<pw::ConcatBody> concat_parts(const Node& n) {
  if (n.op != OpKind::kFusedPointwise || !n.body) return std::nullopt;
  return pw::concat_body(*n.body);
}

// Why the generator cannot build n's program, or "" when it can: an absent input, an op or
// dtype it has no code for, or a fused body it cannot read (constants of more than one element,
// ops that are not pointwise, values read before they are defined, outputs that differ from the
// node's).
std::string program_refusal(const Node& n, const Graph& g) {
  std::string why;
  for (ValueId v : n.inputs)
    if (v == kNoValue) return std::string(op_name(n.op)) + " has an absent input";
  if (n.op != OpKind::kFusedPointwise) {
    if (!op_info(n.op).pointwise()) return std::string(op_name(n.op)) + " is not a pointwise op";
    const size_t first = op_info(n.op).family == OpFamily::kWhere ? 1 : 0;
    return op_supported(n.op, g.type(n.inputs[first]).dtype, &why) ? "" : why;
  }
  if (!n.body) return "fused_pointwise node without a body";
  const Graph& body = *n.body;
  if (body.inputs().size() != n.inputs.size() || body.outputs().size() != n.outputs.size())
    return "fused_pointwise body does not match the node's inputs and outputs";
  std::vector<bool> defined(size_t(body.num_values()), false);
  for (ValueId v : body.inputs()) defined[size_t(v)] = true;
  for (ValueId c : body.constants()) {
    const Value& cv = body.value(c);
    if (cv.type.numel() != 1)
      return "fused_pointwise body holds a constant of " + std::to_string(cv.type.numel()) +
             " elements (the CUDA generator takes one-element constants; larger ones are inputs)";
    defined[size_t(c)] = true;
  }
  const std::vector<int64_t> out = g.type(n.outputs[0]).shape();
  std::optional<pw::ConcatBody> parts;
  try {
    parts = concat_parts(n);
  } catch (const Error& e) {
    return e.what();
  }
  if (parts && int64_t(out.size()) > kMaxRank)
    return "fused_pointwise concat of rank " + std::to_string(out.size()) + " (at most " + std::to_string(kMaxRank) +
           ")";
  for (const auto& node : body.nodes()) {
    // Each value broadcasts to the output, or in a concat program to its part's shape.
    std::vector<int64_t> group = out;
    if (parts) {
      if (node->op == OpKind::kConcat && node->outputs[0] == body.outputs()[0]) {
        defined[size_t(node->outputs[0])] = true;
        continue;
      }
      const int k = parts->part_of[size_t(node->outputs[0])];
      if (k < 0) return std::string("fused_pointwise body op ") + op_name(node->op) + " feeds no part of its concat";
      group = parts->shape[size_t(k)];
    }
    if (node->op == OpKind::kIndexSelect) {
      if (std::string reason = gather_refusal(n, g, *node, group); !reason.empty()) return reason;
      defined[size_t(node->outputs[0])] = true;
      continue;
    }
    if (node->op == OpKind::kReshape) {
      const Node* p = body.value(node->inputs[0]).producer;
      if (p == nullptr || p->op != OpKind::kIndexSelect)
        return "fused_pointwise body reshape does not read a gathered leaf";
      defined[size_t(node->outputs[0])] = true;
      continue;
    }
    if (!op_info(node->op).pointwise() && node->op != OpKind::kCopy)
      return std::string("fused_pointwise body op ") + op_name(node->op) + " is not pointwise";
    if (node->outputs.size() != 1 || !broadcasts_to(body.type(node->outputs[0]).shape(), group))
      return std::string("fused_pointwise body op ") + op_name(node->op) +
             " gives a shape that does not broadcast to the group shape";
    for (ValueId v : node->inputs)
      if (v < 0 || !defined[size_t(v)])
        return std::string("fused_pointwise body op ") + op_name(node->op) + " reads an undefined value";
    const size_t first = op_info(node->op).family == OpFamily::kWhere ? 1 : 0;
    if (!op_supported(node->op, body.type(node->inputs.at(first)).dtype, &why)) return why;
    defined[size_t(node->outputs[0])] = true;
  }
  for (ValueId v : body.outputs())
    if (v < 0 || !defined[size_t(v)]) return "fused_pointwise body output is undefined";
  for (size_t k = 0; k < n.outputs.size(); ++k)
    if (g.type(n.outputs[k]).dtype != body.type(body.outputs()[k]).dtype || g.type(n.outputs[k]).shape() != out)
      return "fused_pointwise output " + std::to_string(k) + " does not match its body value";
  return "";
}

// How node n reads its input i: through a fused node's view of it ("view<i>"), else whole.
OperandView read_view(const Node& n, const Graph& g, size_t i) {
  return input_view(n.op, n.attrs, i, g.type(n.inputs[i]));
}

// Whether n's input i is one element, read once for a whole output of `numel` elements.
bool scalar_input(const Node& n, const Graph& g, size_t i, int64_t numel) {
  return read_view(n, g, i).logical.numel() == 1 && numel != 1;
}

// The broadcast of n's non-scalar inputs read element by element (through their views), then of
// its body's gathered leaves' results, to its output, collapsed; `dense_inputs` gets those
// inputs' positions.
pw::BroadcastPlan broadcast_of(const Node& n, const Graph& g, std::vector<int>* dense_inputs) {
  const TensorType& out = g.type(n.outputs[0]);
  const std::vector<uint8_t> pointer_only = pointer_only_inputs(n);
  std::vector<std::vector<int64_t>> shapes, strides;
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (!pointer_only[i] && !scalar_input(n, g, i, out.numel())) {
      const OperandView v = read_view(n, g, i);
      shapes.push_back(v.logical.shape());
      strides.push_back(v.strides);
      if (dense_inputs) dense_inputs->push_back(int(i));
    }
  if (n.op == OpKind::kFusedPointwise && n.body)
    for (const auto& node : n.body->nodes())
      if (node->op == OpKind::kIndexSelect) shapes.push_back(pw::gathered_shape(*n.body, *node));
  return pw::plan_broadcast(out.shape(), shapes, strides);
}

// Whether the broadcast indexes every input directly (flat) rather than through strides.
bool flat_layout(int64_t numel, const pw::BroadcastPlan& plan) {
  bool flat = numel <= 1 || plan.shape.size() == 1;
  for (size_t k = 0; k < plan.strides.size() && flat && numel > 1; ++k) flat = plan.strides[k][0] == 1;
  return flat;
}

// Why the kernels cannot index n, or "" when they can: more pointers, non-scalar inputs or
// collapsed broadcast dims than they take.
std::string layout_refusal(const Node& n, const Graph& g) {
  if (int(n.inputs.size() + n.outputs.size()) > kMaxPointers)
    return "pointwise node with " + std::to_string(n.inputs.size() + n.outputs.size()) +
           " inputs and outputs (the CUDA kernel takes at most " + std::to_string(kMaxPointers) + ")";
  const int64_t numel = g.type(n.outputs[0]).numel();
  const std::vector<uint8_t> pointer_only = pointer_only_inputs(n);
  size_t dense = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) dense += pointer_only[i] || scalar_input(n, g, i, numel) ? 0 : 1;
  if (n.op == OpKind::kFusedPointwise && n.body) dense += size_t(count_gathers(*n.body));
  if (dense > 16) return "pointwise node with " + std::to_string(dense) + " non-scalar inputs (at most 16)";
  if (concat_parts(n)) return "";  // indexed by the output's own dims, at most kMaxRank (program_refusal)
  const pw::BroadcastPlan plan = broadcast_of(n, g, nullptr);
  if (!flat_layout(numel, plan) && int(plan.shape.size()) > kMaxRank)
    return "pointwise broadcast over " + std::to_string(plan.shape.size()) + " non-mergeable dims (at most " +
           std::to_string(kMaxRank) + ")";
  return "";
}

}  // namespace

bool check(const Node& n, const Graph& g, std::string* why) {
  const OpFamily fam = op_info(n.op).family;
  if (fam != OpFamily::kUnary && fam != OpFamily::kBinary && fam != OpFamily::kWhere && fam != OpFamily::kCast &&
      fam != OpFamily::kFused)
    return fail(why, std::string(op_name(n.op)) + " is not a pointwise op");
  std::string reason = program_refusal(n, g);
  if (reason.empty()) reason = layout_refusal(n, g);
  return reason.empty() || fail(why, reason);
}

bool program_of(const Node& n, const Graph& g, Program* out, std::string* why) {
  if (std::string reason = program_refusal(n, g); !reason.empty()) return fail(why, reason);
  Program p;
  if (n.op != OpKind::kFusedPointwise) {
    for (ValueId v : n.inputs) p.dtype.push_back(g.type(v).dtype);
    p.num_inputs = int(n.inputs.size());
    p.pointer_only.assign(n.inputs.size(), 0);
    Step s;
    s.op = n.op;
    s.out = g.type(n.outputs[0]).dtype;
    for (int i = 0; i < p.num_inputs; ++i) s.in.push_back(i);
    if (op_info(n.op).family == OpFamily::kUnary) s.params = pw::UnaryParams::from(n.op, n.attrs);
    p.dtype.push_back(s.out);
    p.steps.push_back(std::move(s));
    p.outputs = {p.num_inputs};
    *out = std::move(p);
    return true;
  }
  const Graph& body = *n.body;
  const std::optional<pw::ConcatBody> parts = concat_parts(n);
  std::vector<int> index(size_t(body.num_values()), -1);
  for (ValueId v : body.inputs()) {
    index[size_t(v)] = int(p.dtype.size());
    p.dtype.push_back(body.type(v).dtype);
    if (parts) p.input_part.push_back(parts->part_of[size_t(v)]);
  }
  if (parts) {
    p.concat_dim = int(parts->axis);
    p.part_start = parts->start;
  }
  p.num_inputs = int(body.inputs().size());
  p.pointer_only = pointer_only_inputs(n);
  for (ValueId c : body.constants()) {
    const Value& cv = body.value(c);
    double f = 0;
    int64_t i = 0;
    read_constant(cv, &f, &i);
    if (is_floating(cv.type.dtype)) {
      p.const_slot.push_back(int(p.const_float.size()));
      p.const_float.push_back(f);
    } else {
      p.const_slot.push_back(int(p.const_int.size()));
      p.const_int.push_back(i);
    }
    index[size_t(c)] = int(p.dtype.size());
    p.dtype.push_back(cv.type.dtype);
  }
  for (const auto& node : body.nodes()) {
    if (node->op != OpKind::kIndexSelect) continue;
    const TensorType& data = body.type(node->inputs[0]);
    const int64_t axis = node->attrs.get_int("axis");
    Gather q;
    q.data = pw::input_position(body, node->inputs[0]);
    q.index = pw::input_position(body, node->inputs[1]);
    q.index_dtype = body.type(node->inputs[1]).dtype;
    q.count = body.type(node->inputs[1]).numel();
    q.dim = data.dims[size_t(axis)].extent;
    for (int64_t d = axis + 1; d < data.rank(); ++d) q.inner *= data.dims[size_t(d)].extent;
    q.shape = pw::gathered_shape(body, *node);
    if (const OperandView v = read_view(n, g, size_t(q.data)); !v.dense())
      q.view_sizes = v.logical.shape(), q.view_strides = v.strides;
    if (parts) q.part = parts->part_of[size_t(node->outputs[0])];
    index[size_t(node->outputs[0])] = int(p.dtype.size());
    p.dtype.push_back(data.dtype);
    p.gathers.push_back(std::move(q));
  }
  for (const auto& node : body.nodes()) {
    if (node->op == OpKind::kIndexSelect) continue;
    if (node->op == OpKind::kReshape) {  // of a gathered leaf: the same value
      index[size_t(node->outputs[0])] = index[size_t(node->inputs[0])];
      continue;
    }
    Step s;
    s.op = node->op;
    s.out = body.type(node->outputs[0]).dtype;
    for (ValueId v : node->inputs) s.in.push_back(index[size_t(v)]);
    if (op_info(node->op).family == OpFamily::kUnary) s.params = pw::UnaryParams::from(node->op, node->attrs);
    if (parts) s.part = parts->part_of[size_t(node->outputs[0])];
    index[size_t(node->outputs[0])] = int(p.dtype.size());
    p.dtype.push_back(s.out);
    p.steps.push_back(std::move(s));
  }
  for (ValueId v : body.outputs()) p.outputs.push_back(index[size_t(v)]);
  *out = std::move(p);
  return true;
}

namespace {

// Whether gathered leaf q's data, read through its view, keeps every aligned run of `vec`
// consecutive logical elements consecutive and equally aligned in the buffer: the innermost
// dim contiguous and a multiple of vec, every other stride a multiple of vec.
bool view_keeps_runs(const Gather& q, int vec) {
  if (q.view_sizes.empty()) return true;
  const size_t r = q.view_sizes.size();
  if (q.view_strides[r - 1] != 1 || q.view_sizes[r - 1] % vec != 0) return false;
  for (size_t d = 0; d + 1 < r; ++d)
    if (q.view_strides[d] % vec != 0) return false;
  return true;
}

// Whether gathered leaf q (inner 1: a gather along the innermost dim, such as rotate_half's
// permutation of a head's halves) reads every aligned run of `vec` results from `vec`
// consecutive, equally aligned data elements: rows of count results and of dim data elements
// both split into whole runs, and the index goes up by one inside each run.
bool gathers_runs(const Node& n, const Graph& g, const Gather& q, int vec) {
  if (q.inner != 1 || q.count % vec != 0 || q.dim % vec != 0) return false;
  const Value& iv = g.value(n.inputs[size_t(q.index)]);
  auto at = [&](int64_t k) {
    const int64_t v = load_index(iv.data->data(), iv.type.dtype, k);
    return v < 0 ? v + q.dim : v;
  };
  for (int64_t b = 0; b < q.count; b += vec) {
    if (at(b) % vec != 0) return false;
    for (int64_t j = 1; j < vec; ++j)
      if (at(b + j) != at(b) + j) return false;
  }
  return true;
}

// Element strides of a value of `shape` (its own `strides`, row-major when empty) read at every
// position of `part`, whose trailing dims it broadcasts to: 0 where it has no dim or one element.
std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& shape, std::vector<int64_t> strides,
                                       const std::vector<int64_t>& part) {
  if (strides.empty()) strides = row_major_strides(shape);
  std::vector<int64_t> out(part.size(), 0);
  const size_t lead = part.size() - shape.size();
  for (size_t d = lead; d < part.size(); ++d)
    if (shape[d - lead] != 1) out[d] = strides[d - lead];
  return out;
}

// The strided layout of a concat program over the output's own dims: each non-scalar input and
// gathered leaf strided as its part's shape reads it, based at its part's first column.
void concat_layout(const Node& n, const Graph& g, const Program& p, Layout& l) {
  l.dims = g.type(n.outputs[0]).shape();
  l.rank = int(l.dims.size());
  l.strides.assign(size_t(p.num_inputs) + p.gathers.size(), std::vector<int64_t>(size_t(l.rank), 0));
  l.bases.assign(l.strides.size(), 0);
  // Row `row` (an input or a gathered leaf of `shape`, read through `strides`) of part `part`.
  auto place = [&](size_t row, int part, const std::vector<int64_t>& shape, std::vector<int64_t> strides) {
    if (part < 0) return;
    const auto k = size_t(part), axis = size_t(p.concat_dim);
    std::vector<int64_t> part_shape = l.dims;
    part_shape[axis] = p.part_start[k + 1] - p.part_start[k];
    l.strides[row] = broadcast_strides(shape, std::move(strides), part_shape);
    l.bases[row] = -p.part_start[k] * l.strides[row][axis];
  };
  for (int i = 0; i < p.num_inputs; ++i) {
    if (l.scalar[size_t(i)] || p.pointer_only[size_t(i)]) continue;
    const OperandView v = read_view(n, g, size_t(i));
    place(size_t(i), p.input_part[size_t(i)], v.logical.shape(), v.strides);
  }
  for (size_t k = 0; k < p.gathers.size(); ++k)
    place(size_t(p.num_inputs) + k, p.gathers[k].part, p.gathers[k].shape, {});
}

}  // namespace

Layout layout_of(const Node& n, const Graph& g, const Program& p, std::string* why, bool* ok) {
  Layout l;
  const std::string reason = layout_refusal(n, g);
  *ok = reason.empty() || fail(why, reason);
  if (!*ok) return l;
  l.numel = g.type(n.outputs[0]).numel();
  l.wide = l.numel >= (int64_t(1) << 30);
  for (int i = 0; i < p.num_inputs; ++i) {
    l.scalar.push_back(!p.pointer_only[size_t(i)] && scalar_input(n, g, size_t(i), l.numel));
    l.offsets.push_back(read_view(n, g, size_t(i)).offset);
  }
  std::vector<int> dense_inputs;
  pw::BroadcastPlan plan;
  if (p.concat_dim < 0) {
    plan = broadcast_of(n, g, &dense_inputs);
    l.flat = flat_layout(l.numel, plan);
  } else {
    l.flat = false;
  }
  // Vector width: 16 bytes of the widest array that moves an element per output element (a
  // gather's data does, its index does not). A gathered leaf's vector is consecutive in its data
  // when it stays inside one index's block, or inside one run of consecutive indices
  // (gathers_runs).
  size_t widest = 0;
  for (int i = 0; i < p.num_inputs; ++i)
    if (!l.scalar[size_t(i)] && !p.pointer_only[size_t(i)]) widest = std::max(widest, dtype_size(p.dtype[size_t(i)]));
  for (const Gather& q : p.gathers) widest = std::max(widest, dtype_size(p.dtype[size_t(q.data)]));
  for (int v : p.outputs) widest = std::max(widest, dtype_size(p.dtype[size_t(v)]));
  l.vec = widest ? int(16 / widest) : 1;
  if (l.numel < int64_t(l.vec) * 2) l.vec = 1;
  for (const Gather& q : p.gathers)
    if ((q.inner % l.vec != 0 && !gathers_runs(n, g, q, l.vec)) || !view_keeps_runs(q, l.vec)) l.vec = 1;
  l.splat.assign(size_t(p.num_inputs), 0);
  if (l.flat) return l;
  // Strided vectors: vec consecutive elements of the innermost dim are consecutive in every
  // non-scalar input (a per-channel operand of a channels-last tensor, a row added to every row)
  // and start on a multiple of vec there, or are one element of an input broadcast along the
  // innermost dim (a splat: a per-row scale such as a norm's statistics), read once per vector.
  // A concat program's vectors also stay inside one part: along an innermost concat dim every
  // part starts on a multiple of vec.
  bool rows;
  if (p.concat_dim >= 0) {
    concat_layout(n, g, p, l);
    rows = p.concat_dim < l.rank - 1 ||
           std::all_of(p.part_start.begin(), p.part_start.end(), [&](int64_t c) { return c % l.vec == 0; });
  } else {
    l.rank = int(plan.shape.size());
    l.dims = plan.shape;
    l.strides.assign(size_t(p.num_inputs) + p.gathers.size(), std::vector<int64_t>(size_t(l.rank), 0));
    for (size_t k = 0; k < dense_inputs.size(); ++k) l.strides[size_t(dense_inputs[k])] = plan.strides[k];
    for (size_t k = 0; k < p.gathers.size(); ++k)
      l.strides[size_t(p.num_inputs) + k] = plan.strides[dense_inputs.size() + k];
    rows = true;
  }
  rows = rows && l.dims.back() % l.vec == 0;
  for (size_t r = 0; r < l.strides.size() && rows; ++r) {
    const bool input = r < size_t(p.num_inputs);
    if (input && (l.scalar[r] || p.pointer_only[r])) continue;
    const std::vector<int64_t>& st = l.strides[r];
    if (input && st.back() == 0) {
      l.splat[r] = 1;
      continue;
    }
    for (int d = 0; d < l.rank && rows; ++d)
      rows = d == l.rank - 1 ? st[size_t(d)] == 1 : (l.dims[size_t(d)] == 1 || st[size_t(d)] % l.vec == 0);
  }
  if (!rows) {
    l.vec = 1;
    l.splat.assign(size_t(p.num_inputs), 0);
  }
  return l;
}

void adopt_saved_width(Layout& l, int saved) {
  if (saved < 1 || saved >= l.vec || l.vec % saved != 0) return;
  l.vec = saved;
  if (l.vec == 1) l.splat.assign(l.splat.size(), 0);
}

std::vector<int64_t> argument_block(const Program& p, const Layout& l) {
  std::vector<int64_t> a{l.numel};
  if (!l.flat) {
    a.insert(a.end(), l.dims.begin(), l.dims.end());
    for (int i = 0; i < p.num_inputs; ++i)
      if (!l.scalar[size_t(i)] && !p.pointer_only[size_t(i)])
        a.insert(a.end(), l.strides[size_t(i)].begin(), l.strides[size_t(i)].end());
    for (size_t k = 0; k < p.gathers.size(); ++k)
      a.insert(a.end(), l.strides[size_t(p.num_inputs) + k].begin(), l.strides[size_t(p.num_inputs) + k].end());
  }
  if (p.concat_dim >= 0) {  // the parts' starts, then each strided read's base, in the strides' order
    a.insert(a.end(), p.part_start.begin(), p.part_start.end());
    const size_t first = a.size();
    for (int i = 0; i < p.num_inputs; ++i)
      if (!l.scalar[size_t(i)] && !p.pointer_only[size_t(i)]) a.push_back(l.bases[size_t(i)]);
    for (size_t k = 0; k < p.gathers.size(); ++k) a.push_back(l.bases[size_t(p.num_inputs) + k]);
    if (a.size() == first) a.push_back(0);  // the source declares at least one base
  }
  for (double f : p.const_float) {
    int64_t bits;
    std::memcpy(&bits, &f, 8);
    a.push_back(bits);
  }
  a.insert(a.end(), p.const_int.begin(), p.const_int.end());
  if (!l.gather_arguments) return a;
  auto divisor = [&](int64_t d) {
    const std::array<int64_t, 2> f = divisor_fields(d);
    a.insert(a.end(), f.begin(), f.end());
  };
  for (const Gather& q : p.gathers) divisor(q.count);
  for (const Gather& q : p.gathers) divisor(q.inner);
  for (const Gather& q : p.gathers) a.push_back(q.dim);
  for (const Gather& q : p.gathers) {
    for (int64_t d : q.view_sizes) divisor(d);
    a.insert(a.end(), q.view_strides.begin(), q.view_strides.end());
  }
  return a;
}

std::array<int64_t, 2> divisor_fields(int64_t d) {
  if (d < 1 || d >= (int64_t(1) << 31)) return {d, 0};  // no 32-bit quotient is asked of it
  uint64_t shift = 0;
  while ((uint64_t(1) << shift) < uint64_t(d)) ++shift;
  const uint64_t multiplier = ((uint64_t(1) << 32) * ((uint64_t(1) << shift) - uint64_t(d))) / uint64_t(d) + 1;
  return {d, int64_t(multiplier | (shift << 32))};
}

const char* reg_type(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16: return "float";
    case DType::kF64: return "double";
    case DType::kI64: return "long long";
    case DType::kI32: return "int";
    case DType::kI8: return "signed char";
    case DType::kU8: return "unsigned char";
    case DType::kBool: return "bool";
  }
  return "float";
}

const char* store_type(DType t) {
  switch (t) {
    case DType::kF32: return "float";
    case DType::kF16: return "kiln_half";
    case DType::kBF16: return "kiln_bf16";
    case DType::kBool: return "unsigned char";
    default: return reg_type(t);
  }
}

}  // namespace kiln::cuda::pwgen
