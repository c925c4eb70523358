// STUB: shape rules of the gather family (to be written).
#include "src/ops/shape_rules.h"

namespace kiln {

std::vector<TensorType> infer_gather(OpKind op, const TypeList&, const Attrs&) {
  KILN_FAIL(kUnsupported, op_name(op), ": shape rule not implemented yet");
}

}  // namespace kiln
