// STUB: shape rules of the norm family (to be written).
#include "src/ops/shape_rules.h"

namespace kiln {

std::vector<TensorType> infer_norm(OpKind op, const TypeList&, const Attrs&) {
  KILN_FAIL(kUnsupported, op_name(op), ": shape rule not implemented yet");
}

}  // namespace kiln
