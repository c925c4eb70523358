// fold_constants: evaluates, at build time, every node whose inputs are all constants and
// replaces its outputs by new constants.
//
// Does: one forward sweep in topological order, so whole constant chains fold at once (a folded
// output is a constant for the nodes after it); generators (arange, full) have no inputs and
// fold too. Evaluation runs the node on the CPU reference kernel (evaluate_constant_node, the
// evaluator a refit runs the recorded program with: src/passes/constant_eval.h), so a folded
// value is exactly what the engine would have computed on the CPU. A copy of a constant is not
// re-materialized: its users read the constant itself, and a copy that feeds a graph output
// stays (it is what makes a constant output a distinct buffer). Values that lose their last use are dropped
// (Graph::compact) before returning.
// While a RefitRecorder is active (Builder::build of a refittable engine), every evaluated node is
// recorded, so that a refit can derive the folded constants again from new weights: this is the
// only place where a constant derived from a weight is made (src/passes/refit_record.h).
// Does not: fold a node whose outputs exceed kMaxFoldedBytes and have more elements than its
// inputs together (a generator or broadcast that large costs engine size and load time more than
// computing it costs at run time; a transformation of weights, such as a cast, a scale, a
// permutation or a concatenation, never grows them and always folds), fold a node with a symbolic output dim
// or a Value::sized output (a size that depends on shape symbols), or
// fold a node the CPU backend reports as unsupported (it stays a node).
// Folded constants are not weights: refit reaches them through the recorded program only.
#include <algorithm>

#include "kiln/errors.h"
#include "kiln/passes.h"
#include "src/passes/constant_eval.h"
#include "src/passes/pass_util.h"
#include "src/passes/refit_record.h"

namespace kiln {

namespace {

constexpr size_t kMaxFoldedBytes = size_t(16) << 20;

bool all_inputs_constant(const Graph& g, const Node& n) {
  for (ValueId in : n.inputs)
    if (in != kNoValue && !g.value(in).is_constant()) return false;
  return true;
}

bool small_and_static(const Graph& g, const Node& n) {
  size_t bytes = 0;
  int64_t out_numel = 0, in_numel = 0;
  for (ValueId out : n.outputs) {
    if (g.value(out).sized) return false;
    const TensorType& t = g.type(out);
    if (!passes::all_static(t)) return false;
    bytes += t.nbytes();
    out_numel = std::max(out_numel, t.numel());
  }
  for (ValueId in : n.inputs)
    if (in != kNoValue) in_numel += g.type(in).numel();
  return bytes <= kMaxFoldedBytes || (in_numel > 0 && out_numel <= in_numel);
}

}  // namespace

bool fold_constants(Graph& g) {
  bool changed = false;
  std::vector<std::shared_ptr<HostBuffer>> results;
  for (size_t i = 0; i < g.nodes().size();) {
    const Node& n = *g.nodes()[i];
    if (n.op == OpKind::kCopy) {
      ValueId src = n.inputs[0], out = n.outputs[0];
      if (g.value(src).is_constant() && !passes::is_graph_output(g, out)) {
        g.replace_all_uses(out, src);
        g.erase_node(i);
        changed = true;
        continue;
      }
      ++i;
      continue;
    }
    if (!all_inputs_constant(g, n) || !small_and_static(g, n) || !passes::evaluate_constant_node(g, n, results)) {
      ++i;
      continue;
    }
    if (passes::RefitRecorder* recorder = passes::RefitRecorder::active()) recorder->record_fold(g, n, results);
    const std::vector<ValueId> outs = n.outputs;  // n is gone after erase_node
    for (size_t k = 0; k < outs.size(); ++k) {
      TensorType t = g.type(outs[k]);
      ValueId c = g.add_constant(passes::derived_constant_name(g, "folded"), t, std::move(results[k]));
      g.replace_all_uses(outs[k], c);
    }
    // replace_all_uses may append copies (for graph outputs) after the last node: index i still
    // names this node.
    g.erase_node(i);
    changed = true;
  }
  if (changed) g.compact();
  return changed;
}

}  // namespace kiln
