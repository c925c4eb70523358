// broadcast_expands: a pointwise op reading expand(y) reads y instead where y broadcasts to the
// op's output by itself, so the expand's copy is never written (F.normalize divides by a norm
// expanded to x's shape; masks expanded to the scores). Kernels of pointwise ops read their
// operands broadcast (numpy rules), fused or not.
//
// Does: rewrite an operand when the op's shape rule gives the same output types with y in the
// expand's place (another operand carries the full shape). Does not: touch an expand that is a
// graph output or read by other ops (it stays for them), or drop rank-changing reshapes.
//
// broadcast_gather_indices: a gather whose index is expand(y), y of the same rank with extent 1
// where the expand widens it to x's extent, reads y in those `broadcast` dims (DeBERTa's relative
// position index, expanded over batch and heads: its expanded copy is never made or folded).
#include "kiln/passes.h"
#include "src/ops/shape_rules.h"
#include "src/passes/pass_util.h"

namespace kiln {

bool broadcast_expands(Graph& g) {
  return passes::rewrite_each(g, [](Graph& graph, size_t pos) {
    Node& n = *graph.nodes()[pos];
    if (!op_info(n.op).pointwise() || n.op == OpKind::kCast) return false;
    bool changed = false;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const ValueId in = n.inputs[i];
      const Node* p = in == kNoValue ? nullptr : graph.value(in).producer;
      if (p == nullptr || p->op != OpKind::kExpand) continue;
      std::vector<const TensorType*> types;
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        const ValueId v = k == i ? p->inputs[0] : n.inputs[k];
        types.push_back(v == kNoValue ? nullptr : &graph.type(v));
      }
      std::vector<TensorType> out;
      try {
        out = infer_types(n.op, types, n.attrs);
      } catch (const Error&) {
        continue;  // y does not broadcast against the other operands
      }
      bool same = out.size() == n.outputs.size();
      for (size_t k = 0; same && k < out.size(); ++k) same = out[k] == graph.type(n.outputs[k]);
      if (!same) continue;
      n.inputs[i] = p->inputs[0];
      changed = true;
    }
    return changed;
  });
}

bool broadcast_gather_indices(Graph& g) {
  return passes::rewrite_each(g, [](Graph& graph, size_t pos) {
    Node& n = *graph.nodes()[pos];
    if (n.op != OpKind::kGather) return false;
    const Node* p = graph.value(n.inputs[1]).producer;
    if (p == nullptr || p->op != OpKind::kExpand) return false;
    const TensorType& x = graph.type(n.inputs[0]);
    const TensorType& y = graph.type(p->inputs[0]);
    const TensorType& out = graph.type(n.outputs[0]);
    if (y.rank() != out.rank()) return false;
    const int64_t axis = n.attrs.get_int("axis");
    std::vector<int64_t> dims = n.attrs.get_ints("broadcast", {});
    for (int64_t d = 0; d < out.rank(); ++d) {
      const Dim& want = out.dims[size_t(d)];
      if (y.dims[size_t(d)] == want) continue;
      if (d == axis || y.dims[size_t(d)].extent != 1 || !(want == x.dims[size_t(d)])) return false;
      dims.push_back(d);
    }
    n.inputs[1] = p->inputs[0];
    n.attrs.set("broadcast", dims);
    return true;
  });
}

}  // namespace kiln
