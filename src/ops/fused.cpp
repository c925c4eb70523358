// STUB: shape rules of the fused family (to be written).
#include "src/ops/shape_rules.h"

namespace kiln {

std::vector<TensorType> infer_fused(OpKind op, const TypeList&, const Attrs&) {
  KILN_FAIL(kUnsupported, op_name(op), ": shape rule not implemented yet");
}

}  // namespace kiln
