// The op registry: one OpInfo per OpKind, built from KILN_OP_LIST and the per-family shape
// rules (src/ops/<family>.cpp).
#include <algorithm>
#include <array>
#include <string>

#include "kiln/errors.h"
#include "kiln/ir.h"
#include "src/ops/checked.h"
#include "src/ops/shape_rules.h"

namespace kiln {

// Added an op? Follow the checklist at the top of include/kiln/ops.h, then bump this.
inline constexpr int kExpectedOpCount = 74;
static_assert(kNumOps == kExpectedOpCount, "op list changed: follow the checklist in include/kiln/ops.h");

namespace {

ShapeRule rule_for(OpFamily f) {
  switch (f) {
    case OpFamily::kUnary: return &infer_unary;
    case OpFamily::kBinary: return &infer_binary;
    case OpFamily::kWhere: return &infer_where;
    case OpFamily::kCast: return &infer_cast;
    case OpFamily::kReduce: return &infer_reduce;
    case OpFamily::kSoftmax: return &infer_softmax;
    case OpFamily::kNorm: return &infer_norm;
    case OpFamily::kMatmul: return &infer_matmul;
    case OpFamily::kConv: return &infer_conv;
    case OpFamily::kPool: return &infer_pool;
    case OpFamily::kShape: return &infer_shape_op;
    case OpFamily::kGather: return &infer_gather;
    case OpFamily::kAttention: return &infer_attention;
    case OpFamily::kGenerator: return &infer_generator;
    case OpFamily::kFused: return &infer_fused;
  }
  return nullptr;
}

const std::array<OpInfo, kNumOps>& table() {
  static const std::array<OpInfo, kNumOps> t = [] {
    std::array<OpInfo, kNumOps> a{};
#define KILN_X(e, n, f, lo, hi) \
  a[static_cast<size_t>(OpKind::e)] = OpInfo{OpKind::e, n, OpFamily::f, lo, hi, rule_for(OpFamily::f)};
    KILN_OP_LIST(KILN_X)
#undef KILN_X
    return a;
  }();
  return t;
}

}  // namespace

const OpInfo& op_info(OpKind op) {
  auto i = static_cast<size_t>(op);
  KILN_CHECK(i < static_cast<size_t>(kNumOps), kInvalidArgument, "unknown op code ", i);
  return table()[i];
}

const char* op_name(OpKind op) { return op_info(op).name; }

std::optional<OpKind> op_from_name(std::string_view name) {
  for (const OpInfo& info : table())
    if (name == info.name) return info.kind;
  return std::nullopt;
}

std::vector<TensorType> infer_types(OpKind op, const std::vector<const TensorType*>& inputs, const Attrs& attrs) {
  const OpInfo& info = op_info(op);
  int n = static_cast<int>(inputs.size());
  KILN_CHECK(n >= info.min_inputs && (info.max_inputs < 0 || n <= info.max_inputs), kInvalidArgument, info.name,
             ": takes ", info.min_inputs, info.max_inputs < 0 ? " or more" : "",
             info.max_inputs > info.min_inputs ? ".." + std::to_string(info.max_inputs) : std::string(),
             " inputs, got ", n);
  for (int i = 0; i < info.min_inputs; ++i)
    KILN_CHECK(inputs[i] != nullptr, kInvalidArgument, info.name, ": input ", i, " is required");
  // An input read through a view ("view<i>") is seen in the view's type; a node without such an
  // attribute (nearly every one) keeps its inputs as they are.
  const bool views = std::any_of(attrs.items().begin(), attrs.items().end(),
                                 [](const auto& item) { return item.first.rfind("view", 0) == 0; });
  std::vector<TensorType> viewed(views ? inputs.size() : 0);
  std::vector<const TensorType*> seen;
  if (views) {
    seen = inputs;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i] != nullptr && attrs.has(input_view_key(i))) {
        viewed[i] = input_view(op, attrs, i, *inputs[i]).logical;
        seen[i] = &viewed[i];
      }
  }
  std::vector<TensorType> out = info.shape_rule(op, views ? seen : inputs, attrs);
  // Every later size computation (numel, nbytes, strides) multiplies extents unchecked, so an
  // output the attributes make too large to address stops here.
  for (const TensorType& t : out) {
    const Checked ck(op, "the output's byte size");
    int64_t bytes = int64_t(dtype_size(t.dtype));
    for (const Dim& d : t.dims) {
      KILN_CHECK(d.extent >= 0, kInvalidArgument, info.name, ": output ", t.to_string(), " has a negative extent");
      bytes = ck.mul(bytes, d.extent);
    }
  }
  return out;
}

}  // namespace kiln
