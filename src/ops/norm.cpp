// Shape rules of the normalization family (inference forms); y has x's type.
//
// batch_norm (x[N,C,...], mean[C], var[C], weight[C]?, bias[C]?) {eps}: per-channel running
//   statistics, C = x.dims[1].
// layer_norm (x, weight?, bias?) {normalized_rank: k, eps, rms?}: statistics over the last k dims;
//   weight and bias have those k dims. rms (default false): RMSNorm, x * rsqrt(mean(x^2) + eps)
//   (no mean subtracted), then the weight and bias as before.
// group_norm (x[N,C,...], weight[C]?, bias[C]?) {groups, eps, layout?}: statistics per (sample,
//   group of C / groups channels); C % groups == 0. layout "nhwc": x is [N, H, W, C].
//
// x is floating. Parameters are floating and have x's dtype or f32 (mixed precision keeps
// statistics and affine parameters in f32). eps defaults to 1e-5, normalized_rank to 1.
// layer_norm and group_norm take an optional `activation` (src/ops/epilogue.h) applied to y.
#include "src/ops/epilogue.h"
#include "src/ops/pointwise.h"
#include "src/ops/shape_rules.h"

namespace kiln {

namespace {

void check_param(OpKind op, const char* what, const TensorType* p, const TensorType& x,
                 const std::vector<Dim>& dims) {
  if (!p) return;
  KILN_CHECK(p->dtype == x.dtype || p->dtype == DType::kF32, kInvalidArgument, op_name(op), ": ", what, " ",
             p->to_string(), " must have x's dtype (", dtype_name(x.dtype), ") or f32");
  bool same = p->dims.size() == dims.size();
  for (size_t i = 0; same && i < dims.size(); ++i) same = p->dims[i].extent == dims[i].extent;
  TensorType want = with_dtype(*p, p->dtype);
  want.dims = dims;
  KILN_CHECK(same, kShapeMismatch, op_name(op), ": ", what, " must be ", want.to_string(), " for x ", x.to_string(),
             ", got ", p->to_string());
}

const TensorType* opt(const TypeList& in, size_t i) { return i < in.size() ? in[i] : nullptr; }

}  // namespace

std::vector<TensorType> infer_norm(OpKind op, const TypeList& in, const Attrs& a) {
  KILN_CHECK(op_info(op).family == OpFamily::kNorm, kInternal, op_name(op), " is not a norm op");
  const TensorType& x = *in[0];
  KILN_CHECK(is_floating(x.dtype), kInvalidArgument, op_name(op), ": x must be floating, got ", x.to_string());
  const double eps = pw::read_attrs(op, [&] { return a.get_float("eps", 1e-5); });
  KILN_CHECK(eps >= 0.0, kInvalidArgument, op_name(op), ": eps must be >= 0, got ", eps);
  if (op == OpKind::kBatchNorm)
    KILN_CHECK(!a.has("activation"), kInvalidArgument, op_name(op),
               ": attribute 'activation' applies to layer_norm and group_norm only");
  else pw::parse_activation(op, a);

  if (op == OpKind::kLayerNorm) {
    const int64_t k = pw::read_attrs(op, [&] { return a.get_int("normalized_rank", 1); });
    pw::read_attrs(op, [&] { return a.get_bool("rms", false); });
    KILN_CHECK(k >= 1 && k <= x.rank(), kInvalidArgument, op_name(op), ": normalized_rank ", k,
               " must be in [1, rank] for x ", x.to_string());
    const std::vector<Dim> tail(x.dims.end() - k, x.dims.end());
    check_param(op, "weight", opt(in, 1), x, tail);
    check_param(op, "bias", opt(in, 2), x, tail);
    return {x};
  }

  KILN_CHECK(x.rank() >= 2, kShapeMismatch, op_name(op), ": x must be [N, C, ...], got ", x.to_string());
  const bool last = channels_last(op, a);
  KILN_CHECK(!last || x.rank() == 4, kShapeMismatch, op_name(op), ": x with layout \"nhwc\" must be [N, H, W, C], got ",
             x.to_string());
  const std::vector<Dim> channels{x.dims[last ? 3 : 1]};
  if (op == OpKind::kBatchNorm) {
    check_param(op, "mean", in[1], x, channels);
    check_param(op, "var", in[2], x, channels);
    check_param(op, "weight", opt(in, 3), x, channels);
    check_param(op, "bias", opt(in, 4), x, channels);
    return {x};
  }
  const int64_t groups = pw::read_attrs(op, [&] { return a.get_int("groups"); });
  const int64_t c = channels[0].extent;
  KILN_CHECK(groups >= 1 && c % groups == 0, kInvalidArgument, op_name(op), ": ", c, " channels of x ",
             x.to_string(), " do not split into ", groups, " groups");
  check_param(op, "weight", opt(in, 1), x, channels);
  check_param(op, "bias", opt(in, 2), x, channels);
  return {x};
}

}  // namespace kiln
