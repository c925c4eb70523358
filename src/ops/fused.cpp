// fused_pointwise has no shape rule: its output types are those of its body (Node::body),
// which Graph::insert_fused and Graph::verify read directly. Asking for the rule means a
// fused node is being built like an ordinary one, which only the fusion pass may do.
//
// An input may be read through a strided view of it (attribute "view<i>", input_view in
// src/ops/shape_rules.h, written by fold_input_views): Graph::insert_fused and Graph::verify
// check that the body input has the view's type.
#include "src/ops/shape_rules.h"

namespace kiln {

std::vector<TensorType> infer_fused(OpKind op, const TypeList&, const Attrs&) {
  KILN_FAIL(kInvalidArgument, op_name(op), ": fused_pointwise nodes are created by the fusion pass");
}

}  // namespace kiln
