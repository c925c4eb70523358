// STUB: shape rules of the binary family (to be written).
#include "src/ops/shape_rules.h"

namespace kiln {

std::vector<TensorType> infer_binary(OpKind op, const TypeList&, const Attrs&) {
  KILN_FAIL(kUnsupported, op_name(op), ": shape rule not implemented yet");
}

std::vector<int64_t> broadcast_shapes(OpKind op, const std::vector<int64_t>&, const std::vector<int64_t>&) {
  KILN_FAIL(kUnsupported, op_name(op), ": broadcasting not implemented yet");
}

}  // namespace kiln
