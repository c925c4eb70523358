// fold_matmul_views: lets matmul read its operands where a chain of permute, slice, expand and
// reshape nodes found them, instead of a copy made by each permute and expand.
//
// Kiln's IR is dense, so k.transpose(-1, -2) before q @ k^T, or a position table expanded over
// the batch and reshaped to [B * H, S, D] (DeBERTa's relative attention), is written out before
// the GEMM reads it. cuBLASLt reads a matrix stored as it is or transposed, with any leading
// dim, and batches at any strides (pointer arrays where no single stride reaches every batch:
// src/backends/cuda/kernels/matmul.cpp); sgemm reads any row and column strides. So each
// operand becomes a view (matmul's a_view / b_view, src/ops/matmul.cpp) of the furthest value
// its chain reaches (view_chain.h, through expand) whose matrix dims a GEMM can read
// (matrix_layout: one of them contiguous).
//
// Batch dims: a chain may merge dims that are not adjacent in memory into one batch dim (B and
// H of a [B, S, H, D] buffer read as [B * H, S, D]; a stride-0 B and a strided H after an
// expand): such a dim is several strided atoms. The batch dims of both operands are then split
// into their common refinement (the cut points of either operand's atoms, where each divides
// the next: [B * H] read as [B] x [H]), every refined dim one atom in each operand, and the
// matmul runs at the finer batch shape with a reshape of its output back (free: the output is
// dense).
//
// A multiplication or division of an operand by a scalar constant that only the matmul reads
// (attention's scale applied to k before q @ k^T) becomes the GEMM's alpha, applied to the f32
// accumulator: no pass over the operand, and no larger intermediate in f16 than the original had.
//
// The output: where the one reader of a matmul's output is a permute that keeps the column dim
// last (through reshapes that come back to the output's shape: the head merge after p @ v), the
// matmul writes that order itself (out_perm) and the permute goes.
//
// Only where it saves a copy or a scale: an operand whose chain reads its start value whole and
// in order (reshapes alone) keeps its input, reshaped to the split batch where there is one.
// Static, non-empty shapes only (the views are integers). Run it after form_attention and
// fold_attention_layout (their patterns read the chains), before fuse_pointwise; the chains
// left without readers are removed.
#include <algorithm>
#include <cmath>
#include <set>

#include "kiln/errors.h"
#include "kiln/passes.h"
#include "src/ops/access.h"
#include "src/ops/shape_rules.h"
#include "src/passes/pass_util.h"
#include "src/passes/view_chain.h"

namespace kiln {

namespace {

using passes::all_static;
using passes::Atom;
using passes::AtomView;

// A view whose two matrix dims are one atom each and that a GEMM reads (matrix_layout).
bool gemm_readable(const AtomView& v) {
  const size_t r = v.dims.size();
  if (r < 2 || v.dims[r - 2].size() > 1 || v.dims[r - 1].size() > 1) return false;
  auto extent = [&](size_t d) { return v.dims[d].empty() ? int64_t(1) : v.dims[d][0].size; };
  auto stride = [&](size_t d) { return v.dims[d].empty() ? int64_t(0) : v.dims[d][0].stride; };
  return matrix_layout(extent(r - 2), extent(r - 1), stride(r - 2), stride(r - 1)).ok;
}

// v without a scaling by a scalar constant that only this matmul reads (its factor multiplied
// into alpha), or v itself.
ValueId unscaled(const Graph& g, ValueId v, double& alpha) {
  const Node* p = g.value(v).producer;
  if (p == nullptr || (p->op != OpKind::kMul && p->op != OpKind::kDiv) || g.num_uses(v) != 1 ||
      passes::is_graph_output(g, v))
    return v;
  for (size_t i = 0; i < 2; ++i) {
    const ValueId c = p->inputs[i], x = p->inputs[1 - i];
    if ((p->op == OpKind::kDiv && i == 0) || !g.value(c).is_constant() || g.type(c).numel() != 1 ||
        g.type(x).dtype != g.type(v).dtype || g.type(x).shape() != g.type(v).shape())
      continue;
    const double f = passes::constant_as_doubles(g, c)[0];
    if (!std::isfinite(f) || f == 0.0) return v;
    alpha *= p->op == OpKind::kDiv ? 1.0 / f : f;
    return x;
  }
  return v;
}

// The common refinement of two factorizations (outermost first) of one extent: the sizes
// between the cut points of either, or empty when a cut of one falls inside a factor of the
// other without dividing it.
std::vector<int64_t> refine(const std::vector<std::vector<Atom>>& sides, int64_t extent) {
  std::set<int64_t> cuts = {1};  // products of the outer factors of a side
  for (const std::vector<Atom>& atoms : sides) {
    int64_t p = extent;
    for (const Atom& a : atoms) cuts.insert(p /= a.size);
  }
  std::vector<int64_t> sizes;
  int64_t inner = 1;
  for (int64_t c : cuts) {  // ascending: the innermost cut first
    if (c == 1) continue;
    if (c % inner != 0) return {};
    sizes.insert(sizes.begin(), c / inner);
    inner = c;
  }
  if (extent % inner != 0) return {};
  if (extent / inner > 1 || sizes.empty()) sizes.insert(sizes.begin(), extent / inner);
  return sizes;
}

// `atoms` (of a dim of the refined `sizes`' product) split into one atom per refined size.
std::vector<Atom> split_atoms(const std::vector<Atom>& atoms, const std::vector<int64_t>& sizes) {
  std::vector<Atom> out;
  size_t next = 0;
  for (const Atom& a : atoms) {
    int64_t left = a.size;
    while (left > 1) {
      const int64_t s = sizes[next++];
      left /= s;
      out.push_back({s, a.stride * left});
    }
  }
  while (out.size() < sizes.size()) out.push_back({sizes[out.size()], 0});  // extent-1 refined dims
  return out;
}

// Rewrites the matmul at `pos`; returns whether it did.
bool fold_views(Graph& g, size_t pos) {
  const Node& n = *g.nodes()[pos];
  if (n.op != OpKind::kMatmul || n.attrs.has("a_view") || n.attrs.has("b_view") || n.attrs.has("out_perm"))
    return false;
  const TensorType& yt = g.type(n.outputs[0]);
  for (const TensorType* t : {&yt, &g.type(n.inputs[0]), &g.type(n.inputs[1])})
    if (!all_static(*t) || t->numel() == 0) return false;
  double alpha = matmul_alpha(n.attrs);
  const ValueId operand[2] = {unscaled(g, n.inputs[0], alpha), unscaled(g, n.inputs[1], alpha)};
  bool saves = operand[0] != n.inputs[0] || operand[1] != n.inputs[1];
  AtomView views[2];
  bool viewed[2] = {false, false};
  for (size_t i = 0; i < 2; ++i) {
    views[i] = passes::atom_view_of(g, operand[i], true, gemm_readable);
    viewed[i] = views[i].base != operand[i] && !views[i].in_order(g) && all_static(g.type(views[i].base));
    if (!viewed[i]) views[i] = passes::atom_view_of(g, operand[i], false, [](const AtomView&) { return false; });
    saves = saves || viewed[i];
  }
  if (!saves) return false;

  // The refined batch dims, and each operand's atom per refined dim (stride 0 where it broadcasts).
  const std::vector<int64_t> ys = yt.shape();
  const size_t out_batch = ys.size() - 2;
  std::vector<int64_t> sizes;
  std::vector<Atom> batch[2];
  for (size_t d = 0; d < out_batch; ++d) {
    std::vector<std::vector<Atom>> sides;
    std::vector<int> side_of;
    for (int i = 0; i < 2; ++i) {
      const size_t rank = views[i].dims.size(), lead = out_batch - (rank - 2);
      if (d >= lead && !views[i].dims[d - lead].empty()) sides.push_back(views[i].dims[d - lead]), side_of.push_back(i);
    }
    const std::vector<int64_t> refined = refine(sides, ys[d]);
    if (refined.empty()) return false;
    sizes.insert(sizes.end(), refined.begin(), refined.end());
    for (int i = 0; i < 2; ++i) {
      const auto it = std::find(side_of.begin(), side_of.end(), i);
      const std::vector<Atom> atoms = it == side_of.end() ? std::vector<Atom>{} : sides[size_t(it - side_of.begin())];
      for (const Atom& a : split_atoms(atoms, refined)) batch[i].push_back(it == side_of.end() ? Atom{1, 0} : a);
    }
  }
  // A viewed operand is its view's base read through a_view / b_view; another one is itself,
  // reshaped to the refined batch dims where they differ (free, and its sizes stay the reshape's,
  // which a dynamic program fits more often than a view's stride products).
  const std::string name = n.name;
  const ValueId y = n.outputs[0];
  Attrs attrs = n.attrs;
  if (alpha != 1.0) attrs.set("alpha", alpha);
  const char* keys[2] = {"a_view", "b_view"};
  ValueId ins[2];
  size_t at = pos;
  for (size_t i = 0; i < 2; ++i) {
    const AtomView& v = views[i];
    const std::vector<int64_t> shape = g.type(operand[i]).shape();
    std::vector<int64_t> attr = {v.offset}, refined_shape;
    for (const Atom& a : batch[i]) {
      attr.push_back(a.size), attr.push_back(a.size == 1 ? 0 : a.stride);
      refined_shape.push_back(a.size);
    }
    for (size_t d = shape.size() - 2; d < shape.size(); ++d) {
      attr.push_back(shape[d]), attr.push_back(v.dims[d].empty() ? 0 : v.dims[d][0].stride);
      refined_shape.push_back(shape[d]);
    }
    ins[i] = viewed[i] ? v.base : operand[i];
    if (viewed[i]) {
      attrs.set(keys[i], attr);
    } else if (refined_shape != shape) {
      Attrs r;
      r.set("shape", refined_shape);
      ins[i] = g.insert_node(at++, OpKind::kReshape, {operand[i]}, r, name)[0];
    }
  }
  const ValueId y_new = g.insert_node(at++, OpKind::kMatmul, {ins[0], ins[1]}, attrs, name)[0];
  ValueId result = y_new;
  if (g.type(y_new).shape() != ys) {
    Attrs r;
    r.set("shape", ys);
    result = g.insert_node(at++, OpKind::kReshape, {y_new}, r, name)[0];
  }
  g.replace_all_uses(y, result);
  g.erase_node(at);
  return true;
}

// The matmul at `pos` writes its output in the order of the one permute that reads it (through
// reshapes that come back to its shape), keeping the column dim last: out_perm, and the permute
// goes.
bool fold_output_permute(Graph& g, size_t pos) {
  const Node& n = *g.nodes()[pos];
  if (n.op != OpKind::kMatmul || n.attrs.has("out_perm") || !all_static(g.type(n.outputs[0]))) return false;
  const std::vector<std::vector<int>> users = g.users();
  auto only_reader = [&](ValueId v) -> const Node* {
    const std::vector<int>& u = users[size_t(v)];
    if (u.size() != 1 || passes::is_graph_output(g, v)) return nullptr;
    return g.nodes()[size_t(u[0])].get();
  };
  const ValueId y = n.outputs[0];
  const Node* r = only_reader(y);
  while (r != nullptr && r->op == OpKind::kReshape) r = only_reader(r->outputs[0]);
  if (r == nullptr || r->op != OpKind::kPermute || g.type(r->inputs[0]).shape() != g.type(y).shape()) return false;
  const std::vector<int64_t> perm = r->attrs.get_ints("perm");
  const int64_t rank = g.type(y).rank();
  if (passes::is_identity(perm) || perm.back() != rank - 1) return false;
  Attrs attrs = n.attrs;
  attrs.set("out_perm", perm);
  const ValueId placed = r->outputs[0];
  const ValueId y_new = g.insert_node(pos, OpKind::kMatmul, n.inputs, attrs, n.name)[0];
  g.replace_all_uses(placed, y_new);
  g.erase_node(pos + 1);
  return true;
}

}  // namespace

bool fold_matmul_views(Graph& g) {
  const bool views = passes::rewrite_each(g, fold_views);
  return passes::rewrite_each(g, fold_output_permute) || views;
}

}  // namespace kiln
