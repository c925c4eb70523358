// Shape rules of the pool family: max_pool, avg_pool and adaptive_avg_pool over 1 or 2
// spatial dims of x[N, C, *spatial], with PyTorch's output sizes:
//
//   out = floor_or_ceil((in + 2p - d(k-1) - 1) / s) + 1, and with ceil_mode the last window
//   must start inside the input or the left padding (else it is dropped);
//   adaptive: out = output_size.
//
// Also PyTorch's checks: padding at most half the kernel (undilated, as PyTorch does); stride
// defaults to the kernel (missing or empty list). max_pool and avg_pool over 2 spatial dims may
// be channels-last (layout = "nhwc"): x [N, H, W, C] gives [N, OH, OW, C].
#include <string>
#include <variant>

#include "src/ops/checked.h"
#include "src/ops/shape_rules.h"

namespace kiln {

namespace {

const std::vector<int64_t>* ints_or_null(OpKind op, const Attrs& a, const char* key) {
  if (!a.has(key)) return nullptr;
  const auto* v = std::get_if<std::vector<int64_t>>(&a.items().at(key));
  KILN_CHECK(v != nullptr, kInvalidArgument, op_name(op), ": attribute '", key, "' must be a list of ints");
  return v;
}

bool bool_attr(OpKind op, const Attrs& a, const char* key, bool fallback) {
  if (!a.has(key)) return fallback;
  const AttrValue& v = a.items().at(key);
  KILN_CHECK(std::holds_alternative<bool>(v), kInvalidArgument, op_name(op), ": attribute '", key,
             "' must be a bool");
  return std::get<bool>(v);
}

int64_t pooled_size(OpKind op, int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dilation, bool ceil_mode) {
  const Checked ck(op, "the output size from kernel, stride, padding and dilation");
  const int64_t reach = ck.add(ck.mul(dilation, k - 1), 1);  // the dilated kernel's extent
  const int64_t num = ck.add(ck.sub(ck.add(in, ck.mul(2, pad)), reach), ceil_mode ? stride - 1 : 0);
  // Floor division; num > INT64_MIN since in and pad are >= 0, so -num is defined.
  int64_t out = (num >= 0 ? num / stride : -(ck.add(-num, stride - 1) / stride)) + 1;
  if (ceil_mode && ck.mul(out - 1, stride) >= ck.add(in, pad)) --out;
  return out;
}

}  // namespace

namespace {

std::vector<TensorType> infer_pool_channels_first(OpKind op, const TensorType& x, const Attrs& a);

}  // namespace

std::vector<TensorType> infer_pool(OpKind op, const TypeList& in, const Attrs& a) {
  KILN_CHECK(op == OpKind::kMaxPool || op == OpKind::kAvgPool || op == OpKind::kAdaptiveAvgPool, kInternal,
             op_name(op), " is not in the pool family");
  if (!channels_last(op, a)) return infer_pool_channels_first(op, *in[0], a);
  KILN_CHECK(in[0]->rank() == 4, kShapeMismatch, op_name(op), ": layout \"nhwc\" takes x [N, H, W, C], got ",
             in[0]->to_string());
  return {channels_last_view(infer_pool_channels_first(op, channels_first_view(*in[0]), a)[0])};
}

namespace {

std::vector<TensorType> infer_pool_channels_first(OpKind op, const TensorType& x, const Attrs& a) {
  const char* name = op_name(op);
  KILN_CHECK(is_floating(x.dtype), kInvalidArgument, name, ": x must be floating, got ", x.to_string());
  KILN_CHECK(x.rank() == 3 || x.rank() == 4, kShapeMismatch, name,
             ": x must be [N, C, *spatial] with 1 or 2 spatial dims, got ", x.to_string());
  const size_t nsp = size_t(x.rank() - 2);
  TensorType out = x;

  if (op == OpKind::kAdaptiveAvgPool) {
    KILN_CHECK(a.has("output_size"), kInvalidArgument, name, ": missing attribute 'output_size'");
    auto size = spatial_attr(op, a, "output_size", nsp, {}, 1);
    for (size_t i = 0; i < nsp; ++i) {
      KILN_CHECK(x.dims[2 + i].extent >= 1, kShapeMismatch, name, ": x ", x.to_string(), " has an empty spatial dim");
      out.dims[2 + i] = Dim{};
      out.dims[2 + i].extent = size[i];
    }
    return {out};
  }

  KILN_CHECK(a.has("kernel"), kInvalidArgument, name, ": missing attribute 'kernel'");
  auto kernel = spatial_attr(op, a, "kernel", nsp, {}, 1);
  const std::vector<int64_t>* s = ints_or_null(op, a, "stride");
  auto stride = (s && s->empty()) ? kernel : spatial_attr(op, a, "stride", nsp, kernel, 1);
  auto padding = spatial_attr(op, a, "padding", nsp, std::vector<int64_t>(nsp, 0), 0);
  std::vector<int64_t> dilation(nsp, 1);
  if (op == OpKind::kMaxPool) {
    dilation = spatial_attr(op, a, "dilation", nsp, dilation, 1);
  } else {
    KILN_CHECK(!a.has("dilation"), kInvalidArgument, name, ": avg_pool takes no dilation");
    bool_attr(op, a, "count_include_pad", true);
    if (a.has("divisor")) {
      const AttrValue& v = a.items().at("divisor");
      KILN_CHECK(std::holds_alternative<int64_t>(v), kInvalidArgument, name, ": attribute 'divisor' must be an int");
      KILN_CHECK(std::get<int64_t>(v) >= 0, kInvalidArgument, name, ": divisor must be >= 0 (0 = none), got ",
                 std::get<int64_t>(v));
    }
  }
  bool ceil_mode = bool_attr(op, a, "ceil_mode", false);

  for (size_t i = 0; i < nsp; ++i) {
    KILN_CHECK(padding[i] <= kernel[i] / 2, kInvalidArgument, name, ": padding ", list_str(padding),
               " must be at most half of the kernel ", list_str(kernel));
    int64_t o = pooled_size(op, x.dims[2 + i].extent, kernel[i], padding[i], stride[i], dilation[i], ceil_mode);
    KILN_CHECK(o >= 1, kShapeMismatch, name, ": x ", x.to_string(), " is too small for kernel ", list_str(kernel),
               " (output size ", o, " in spatial dim ", i, ")");
    out.dims[2 + i] = Dim{};
    out.dims[2 + i].extent = o;
  }
  return {out};
}

}  // namespace
}  // namespace kiln
