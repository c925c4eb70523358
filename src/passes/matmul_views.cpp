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
#include <optional>

#include "kiln/errors.h"
#include "kiln/passes.h"
#include "src/ops/access.h"
#include "src/ops/shape_rules.h"
#include "src/passes/pass_util.h"
#include "src/passes/view_chain.h"

namespace kiln {

namespace {

using passes::all_static;
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
  const std::optional<passes::RefinedBatches> refined =
      passes::refine_batches({&views[0], &views[1]}, {ys.begin(), ys.end() - 2});
  if (!refined) return false;
  // A viewed operand is its view's base read through a_view / b_view; another one is itself,
  // reshaped to the refined batch dims (free, and a reshape's sizes fit a dynamic program more
  // often than a view's stride products).
  const std::string name = n.name;
  const ValueId y = n.outputs[0];
  Attrs attrs = n.attrs;
  if (alpha != 1.0) attrs.set("alpha", alpha);
  const char* keys[2] = {"a_view", "b_view"};
  ValueId ins[2];
  passes::NodeInserter at{g, pos, name};
  for (size_t i = 0; i < 2; ++i) {
    const passes::RefinedOperand r = passes::refined_operand(g, operand[i], views[i], refined->atoms[i]);
    ins[i] = viewed[i] ? views[i].base : at.reshape(operand[i], r.shape);
    if (viewed[i]) attrs.set(keys[i], passes::view_attribute(views[i].offset, r.shape, r.strides));
  }
  const ValueId result = at.reshape(at.node(OpKind::kMatmul, {ins[0], ins[1]}, attrs), ys);
  g.replace_all_uses(y, result);
  g.erase_node(at.pos);
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
