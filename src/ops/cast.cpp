// Shape rule of cast: x's shape, the dtype attribute's dtype. Every dtype casts to every
// other; what the values become is pw::cast_value (src/ops/pointwise.h).
#include "src/ops/pointwise.h"
#include "src/ops/shape_rules.h"

namespace kiln {

std::vector<TensorType> infer_cast(OpKind op, const TypeList& in, const Attrs& a) {
  KILN_CHECK(op == OpKind::kCast, kInternal, op_name(op), " is not cast");
  const DType to = pw::read_attrs(op, [&] { return a.get_dtype("dtype"); });
  return {with_dtype(*in[0], to)};
}

}  // namespace kiln
