// fold_attention_layout: lets sdpa read q, k and v where a head split left them and write its
// output where the head merge wants it, so that the split and merge around attention move no
// bytes.
//
// Kiln's IR is dense, so each permute and slice of a head split is a copy (a reshape of a dense
// value costs nothing: the memory planner aliases it). Three rewrites, tried in this order on each
// sdpa the filter accepts:
//
// 0. grouped-query attention (Llama, Qwen2, Mistral: transformers' repeat_kv expands k and v of
//    [B, KVH, S, D] to [B, KVH, n_rep, S, D] and reshapes them to [B, H, S, D]): where k or v
//    reaches, through expand (view_chain.h atom_view_of), a view whose batch dims repeat a block
//    (a stride-0 atom), the batch dims of q, k, v, the mask and the output are split into their
//    common refinement ([B, H] -> [B, KVH, n_rep]), every refined dim one atom per operand, and
//    the sdpa reads k and v as views with stride 0 over n_rep: each group of heads reads its one
//    k / v head, and the expanded copies go. q and the mask are reshaped (free); a permute that
//    alone reads the output becomes out_perm over the refined dims; a reshape brings the output
//    back to the shape its readers saw.
// 1. layout "bshd" (the head split of transformers' encoders: q = linear(x).view(B, S, H, D)
//    .transpose(1, 2), likewise k, v):
//      sdpa(permute(xq, P), permute(xk, P), permute(xv, P), [mask])    with P = [0, 2, 1, 3]
//    becomes permute(sdpa(xq, xk, xv, [mask]) {layout="bshd"}, P): the same values, since a
//    bshd sdpa computes attention per (B, H) on exactly the rows the permutes would have
//    gathered. Every permute reading the new output permute then folds with it
//    (permute(permute(v, P), Q) -> permute(v, P o Q), or v for the identity): the transpose
//    back before the merge disappears.
//
// 2. operand views (torchvision's MultiheadAttention: one qkv linear, its output reshaped,
//    permuted, sliced into q, k, v, each reshaped and permuted again; view_chain.h): each of q,
//    k, v that strided_view_of resolves to a view of an earlier value (not merely a reshape of
//    it) is read through that view: the sdpa takes the view's base as the operand and the view
//    as q_view / k_view / v_view = [offset, size0, stride0, ...] (src/ops/attention.cpp). When
//    every reader of the output is one permute that keeps the head dim last (there:
//    [B, H, S, D] -> [S, B, H, D] before the merge), the sdpa writes that order itself
//    (out_perm) and the permutes go. Such a block becomes
//      linear -> sdpa(views of the qkv output) {out_perm=[2,0,1,3]} -> reshape -> linear.
//    The chains left without readers are removed (eliminate_dead_code).
//
// The fused attention kernels read every operand with 16-byte vector loads, so a view or
// permuted output is used only when its offset and every stride but the head dim's are
// multiples of 16 bytes; otherwise that operand keeps its copy. An operand that is no view
// (a linear's output, a graph input) stays as it is.
//
// Does not: fold an sdpa that already has a layout or views, an sdpa the filter declines (by
// default those the fused kernels do not serve: f32, head dims other than 64 / 128; see
// fused_attention_shape; the CUDA builder passes strided_attention_shape), views through
// expand other than rewrite 0's, views through other ops, or permutes elsewhere in the graph.
// The old chains stay where something else reads them. Run it after fuse_epilogue and before
// fuse_pointwise (the pointwise ops between two permutes would otherwise hide the pair); on the
// CPU a strided sdpa runs through copies, so the pass pays off on CUDA, whose kernels read the
// strides directly.
#include <algorithm>
#include <optional>
#include <unordered_set>

#include "kiln/errors.h"
#include "kiln/passes.h"
#include "src/ops/access.h"
#include "src/ops/shape_rules.h"
#include "src/passes/pass_util.h"
#include "src/passes/view_chain.h"

namespace kiln {

namespace {

const passes::Perm kSwap = {0, 2, 1, 3};
const char* const kViewKeys[3] = {"q_view", "k_view", "v_view"};

bool already_strided(const Attrs& a) {
  return a.has("layout") || a.has("q_view") || a.has("k_view") || a.has("v_view") || a.has("out_perm");
}

// The x of permute(x, kSwap) producing v (x of rank 4), or kNoValue.
ValueId unswapped(const Graph& g, ValueId v) {
  const Node* p = passes::permute_of(g, v);
  if (p == nullptr || passes::perm_of(*p) != kSwap || g.type(p->inputs[0]).rank() != 4) return kNoValue;
  return p->inputs[0];
}

// Rewrite 1 of the sdpa at `pos`; returns the new output permute's value, or kNoValue.
ValueId rewrite_bshd(Graph& g, size_t pos, const AttentionFilter& foldable) {
  const Node& n = *g.nodes()[pos];
  if (n.op != OpKind::kSdpa || already_strided(n.attrs) || !foldable(g, n)) return kNoValue;
  std::vector<ValueId> ins = n.inputs;
  for (size_t i = 0; i < 3; ++i) {
    ins[i] = unswapped(g, n.inputs[i]);
    if (ins[i] == kNoValue) return kNoValue;
    // An operand cut out of an earlier value (q, k and v sliced from one qkv linear) would still
    // be copied into a bshd operand; rewrite 2 reads it as a view of that value instead.
    const passes::ValueView v = passes::strided_view_of(g, ins[i]);
    if (v.base != ins[i] && !v.whole_base(g)) return kNoValue;
  }
  const std::string name = n.name;
  Attrs attrs = n.attrs;
  attrs.set("layout", std::string("bshd"));
  const ValueId y = n.outputs[0];
  size_t at = pos;
  const ValueId y_bshd = g.insert_node(at++, OpKind::kSdpa, ins, attrs, name)[0];
  Attrs swap;
  swap.set("perm", kSwap);
  const ValueId y_bhsd = g.insert_node(at++, OpKind::kPermute, {y_bshd}, swap, name)[0];
  g.replace_all_uses(y, y_bhsd);
  g.erase_node(at);
  return y_bhsd;
}

// The fused kernels' rule: offset and every stride of a dim longer than 1, but the last, are
// multiples of 16 bytes; the last stride is 1.
bool aligned(int64_t offset, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, size_t es) {
  if (strides.empty() || strides.back() != 1 || (offset * int64_t(es)) % 16 != 0) return false;
  for (size_t d = 0; d + 1 < sizes.size(); ++d)
    if (sizes[d] > 1 && (strides[d] * int64_t(es)) % 16 != 0) return false;
  return true;
}

// The permute every reader of y applies, when y (no graph output) is read only by permutes of
// one perm that moves something but keeps the head dim last; their positions go to `readers`.
// Empty otherwise.
passes::Perm output_perm(const Graph& g, ValueId y, std::vector<size_t>& readers) {
  if (passes::is_graph_output(g, y)) return {};
  std::vector<int> users = g.users()[size_t(y)];
  std::sort(users.begin(), users.end());
  users.erase(std::unique(users.begin(), users.end()), users.end());
  passes::Perm perm;
  for (int u : users) {
    const Node& r = *g.nodes()[size_t(u)];
    if (r.op != OpKind::kPermute || (!perm.empty() && passes::perm_of(r) != perm)) return {};
    // Two readers that are graph outputs would become one value named twice.
    if (users.size() > 1 && passes::is_graph_output(g, r.outputs[0])) return {};
    perm = passes::perm_of(r);
    readers.push_back(size_t(u));
  }
  if (perm.empty() || passes::is_identity(perm) || perm.back() != int64_t(perm.size()) - 1) return {};
  return perm;
}

// Rewrite 2 of the sdpa at `pos`; returns whether it changed the graph.
bool rewrite_views(Graph& g, size_t pos, const AttentionFilter& foldable) {
  const Node& n = *g.nodes()[pos];
  if (n.op != OpKind::kSdpa || already_strided(n.attrs) || !foldable(g, n)) return false;
  const size_t es = dtype_size(g.type(n.inputs[0]).dtype);
  std::vector<ValueId> ins = n.inputs;
  Attrs attrs = n.attrs;
  bool changed = false;
  for (size_t i = 0; i < 3; ++i) {
    const passes::ValueView v = passes::strided_view_of(g, n.inputs[i]);
    if (v.base == n.inputs[i] || v.whole_base(g) || !aligned(v.offset, v.sizes, v.strides, es)) continue;
    ins[i] = v.base;
    attrs.set(kViewKeys[i], passes::view_attribute(v.offset, v.sizes, v.strides));
    changed = true;
  }
  const ValueId y = n.outputs[0];
  std::vector<size_t> readers;
  const passes::Perm perm = output_perm(g, y, readers);
  if (!perm.empty()) {
    const std::vector<int64_t> ys = g.type(y).shape();
    std::vector<int64_t> placed, strides(ys.size());
    for (int64_t p : perm) placed.push_back(ys[size_t(p)]);
    const std::vector<int64_t> placed_strides = row_major_strides(placed);
    for (size_t j = 0; j < perm.size(); ++j) strides[size_t(perm[j])] = placed_strides[j];
    if (aligned(0, ys, strides, es)) {
      attrs.set("out_perm", perm);
      changed = true;
    } else {
      readers.clear();
    }
  } else {
    readers.clear();
  }
  if (!changed) return false;
  const std::string name = n.name;
  const ValueId y_new = g.insert_node(pos, OpKind::kSdpa, ins, attrs, name)[0];
  // The old sdpa is now at pos + 1 and each reader one place later than it was.
  if (readers.empty()) g.replace_all_uses(y, y_new);
  for (size_t r : readers) g.replace_all_uses(g.nodes()[r + 1]->outputs[0], y_new);
  std::sort(readers.rbegin(), readers.rend());
  for (size_t r : readers) g.erase_node(r + 1);
  g.erase_node(pos + 1);
  return true;
}

// A q / k / v view the attention kernels read: the sequence and head dims one atom each, the head
// dim contiguous (batch dims may be several atoms: rewrite_grouped splits them).
bool attention_readable(const passes::AtomView& v) {
  const size_t r = v.dims.size();
  return r >= 3 && v.dims[r - 2].size() <= 1 && v.dims[r - 1].size() == 1 && v.dims[r - 1][0].stride == 1;
}

// Whether a batch dim of `v` repeats a block of its base (a stride-0 atom: an expand).
bool repeats(const passes::AtomView& v) {
  for (size_t d = 0; d + 2 < v.dims.size(); ++d)
    for (const passes::Atom& a : v.dims[d])
      if (a.stride == 0 && a.size > 1) return true;
  return false;
}

// Rewrite 0 of the sdpa at `pos` (grouped-query attention); returns whether it changed the graph.
bool rewrite_grouped(Graph& g, size_t pos, const AttentionFilter& foldable) {
  const Node& n = *g.nodes()[pos];
  if (n.op != OpKind::kSdpa || already_strided(n.attrs) || !foldable(g, n)) return false;
  const bool masked = n.inputs.size() > 3 && n.inputs[3] != kNoValue;
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (n.inputs[i] != kNoValue && (!passes::all_static(g.type(n.inputs[i])) || g.type(n.inputs[i]).numel() == 0))
      return false;
  const TensorType& yt = g.type(n.outputs[0]);
  const size_t es = dtype_size(yt.dtype);
  passes::AtomView views[3];
  bool viewed[3], grouped = false;
  for (size_t i = 0; i < 3; ++i) {
    const ValueId x = n.inputs[i];
    views[i] = passes::atom_view_of(g, x, true, attention_readable);
    viewed[i] = views[i].base != x && !views[i].in_order(g) && passes::all_static(g.type(views[i].base));
    if (!viewed[i]) views[i] = passes::atom_view_of(g, x, false, [](const passes::AtomView&) { return false; });
    grouped = grouped || (i > 0 && viewed[i] && repeats(views[i]));
  }
  if (!grouped) return false;
  const std::vector<int64_t> ys = yt.shape();
  const size_t batch_rank = ys.size() - 2;
  const std::optional<passes::RefinedBatches> refined =
      passes::refine_batches({&views[0], &views[1], &views[2]}, {ys.begin(), ys.begin() + int64_t(batch_rank)});
  if (!refined) return false;

  // Each refined batch dim's position, per original batch dim.
  std::vector<std::vector<int64_t>> group_dims;
  int64_t next = 0;
  for (const std::vector<int64_t>& sizes : refined->groups) {
    group_dims.emplace_back();
    for (size_t k = 0; k < sizes.size(); ++k) group_dims.back().push_back(next++);
  }
  group_dims.push_back({next++});  // L
  group_dims.push_back({next++});  // Ev
  std::vector<int64_t> refined_y;
  for (const std::vector<int64_t>& sizes : refined->groups)
    refined_y.insert(refined_y.end(), sizes.begin(), sizes.end());
  refined_y.push_back(ys[batch_rank]);
  refined_y.push_back(ys[batch_rank + 1]);

  // The output: written in the order of a permute that alone reads it (the head merge), as in
  // rewrite 2, over the refined dims.
  std::vector<size_t> readers;
  const passes::Perm perm = output_perm(g, n.outputs[0], readers);
  passes::Perm refined_perm;
  for (int64_t p : perm)
    refined_perm.insert(refined_perm.end(), group_dims[size_t(p)].begin(), group_dims[size_t(p)].end());
  if (!refined_perm.empty()) {
    std::vector<int64_t> placed, strides(refined_y.size());
    for (int64_t p : refined_perm) placed.push_back(refined_y[size_t(p)]);
    const std::vector<int64_t> placed_strides = row_major_strides(placed);
    for (size_t j = 0; j < refined_perm.size(); ++j) strides[size_t(refined_perm[j])] = placed_strides[j];
    if (!aligned(0, refined_y, strides, es)) refined_perm.clear(), readers.clear();
  }

  Attrs attrs = n.attrs;
  passes::RefinedOperand operands[3];
  for (size_t i = 0; i < 3; ++i) {
    operands[i] = passes::refined_operand(g, n.inputs[i], views[i], refined->atoms[i]);
    if (!viewed[i]) continue;
    const passes::RefinedOperand& r = operands[i];
    if (!aligned(views[i].offset, r.shape, r.strides, es)) return false;
    attrs.set(kViewKeys[i], passes::view_attribute(views[i].offset, r.shape, r.strides));
  }
  if (!refined_perm.empty()) attrs.set("out_perm", refined_perm);
  const ValueId y = n.outputs[0];
  std::vector<ValueId> ins = n.inputs;
  passes::NodeInserter at{g, pos, n.name};
  for (size_t i = 0; i < 3; ++i) ins[i] = viewed[i] ? views[i].base : at.reshape(ins[i], operands[i].shape);
  if (masked) {  // the mask (dense) reshaped to the refined scores: a dim it broadcasts over stays 1
    const std::vector<int64_t> ms = g.type(ins[3]).shape();
    const size_t lead = ys.size() - ms.size();
    std::vector<int64_t> shape;
    for (size_t d = 0; d < batch_rank; ++d)
      for (int64_t s : refined->groups[d]) shape.push_back(d >= lead && ms[d - lead] != 1 ? s : 1);
    shape.insert(shape.end(), ms.end() - 2, ms.end());
    ins[3] = at.reshape(ins[3], shape);
  }
  const ValueId y_new = at.node(OpKind::kSdpa, ins, attrs);
  // Back to the shape the readers saw: the permutes' outputs, or the sdpa's own. The old sdpa
  // and its readers moved by the nodes inserted before them.
  if (readers.empty()) {
    g.replace_all_uses(y, at.reshape(y_new, ys));
  } else {
    const ValueId placed = g.nodes()[readers[0] + (at.pos - pos)]->outputs[0];
    const ValueId result = at.reshape(y_new, g.type(placed).shape());
    const size_t moved = at.pos - pos;
    for (size_t r : readers) g.replace_all_uses(g.nodes()[r + moved]->outputs[0], result);
    std::sort(readers.rbegin(), readers.rend());
    for (size_t r : readers) g.erase_node(r + moved);
  }
  g.erase_node(at.pos);  // the old sdpa
  return true;
}

}  // namespace

// Others run as matmul-softmax-matmul, which wants whole heads contiguous unless its GEMMs take
// the [B, H] batch strides of [B, S, H, D] operands in one launch (with one batch stride it
// would launch both GEMMs and the softmax once per batch index instead of once per sdpa).
bool fused_attention_shape(const Graph& g, const Node& sdpa) {
  const TensorType& q = g.type(sdpa.inputs[0]);
  const int64_t d = q.rank() ? q.dims.back().extent : 0;
  return (q.dtype == DType::kF16 || q.dtype == DType::kBF16) && d >= 32 && d <= 128 && d % 32 == 0;
}

bool strided_attention_shape(const Graph& g, const Node& sdpa) {
  const DType dt = g.type(sdpa.inputs[0]).dtype;
  return dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16;
}

bool fold_attention_layout(Graph& g, const AttentionFilter& foldable) {
  std::unordered_set<ValueId> swapped_outputs;
  bool changed = false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    if (rewrite_grouped(g, pos, foldable)) {
      changed = true;
      continue;
    }
    const ValueId v = rewrite_bshd(g, pos, foldable);
    if (v != kNoValue) {
      swapped_outputs.insert(v);
    } else if (rewrite_views(g, pos, foldable)) {
      changed = true;
    }
  }
  if (swapped_outputs.empty() && !changed) return false;
  for (size_t pos = 0; pos < g.nodes().size(); ++pos) {
    const Node& n = *g.nodes()[pos];
    if (n.op == OpKind::kPermute && swapped_outputs.count(n.inputs[0]) && passes::fold_permutes(g, pos)) --pos;
  }
  eliminate_dead_code(g);
  return true;
}

}  // namespace kiln
