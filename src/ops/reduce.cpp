// STUB: shape rules of the reduce family (to be written).
#include "src/ops/shape_rules.h"

namespace kiln {

std::vector<TensorType> infer_reduce(OpKind op, const TypeList&, const Attrs&) {
  KILN_FAIL(kUnsupported, op_name(op), ": shape rule not implemented yet");
}

}  // namespace kiln
