// Importers of normalizations: batch norm in inference form (three overloads), layer norm, RMS
// norm (the fused overload torch's CUDA dispatch gives nn.RMSNorm) and group norm.
//
// The ATen overloads return (out, mean, rstd)-like tuples; Kiln computes only `out`, so a node
// whose other outputs are used is refused. Batch-norm statistics and affine parameters are cast
// to the input's dtype (a half model may keep them in float).
#include <algorithm>
#include <limits>

#include "src/import/import_context.h"

namespace kiln::aten {

namespace {

void check_stats_unused(const NodeArgs& args) { args.require_unused_from(1, "saved statistics"); }

// batch_norm (x, mean, var, weight?, bias?) {eps}.
ValueId batch_norm(ImportContext& cx, size_t mean_pos, size_t eps_pos) {
  ValueId x = cx.input(0, "input");
  const DType dt = cx.type(x).dtype;
  std::vector<ValueId> in = {x, cx.cast(cx.input(mean_pos, "running_mean"), dt),
                             cx.cast(cx.input(mean_pos + 1, "running_var"), dt)};
  auto w = cx.opt_input(1, "weight"), b = cx.opt_input(2, "bias");
  in.push_back(w ? cx.cast(*w, dt) : kNoValue);
  in.push_back(b ? cx.cast(*b, dt) : kNoValue);
  while (in.back() == kNoValue) in.pop_back();
  Attrs a;
  a.set("eps", cx.args.get_float(eps_pos, "eps"));
  return cx.add(OpKind::kBatchNorm, in, a);
}

// _native_batch_norm_legit_no_training(input, weight?, bias?, running_mean, running_var, momentum, eps)
std::vector<ValueId> convert_bn_no_training(ImportContext& cx) { return {batch_norm(cx, 3, 6)}; }

// native_batch_norm / _native_batch_norm_legit(input, weight?, bias?, running_mean, running_var,
// training, momentum, eps): inference only.
void check_bn_training(const NodeArgs& args) {
  check_stats_unused(args);
  if (args.get_bool(5, "training", false)) reject("batch norm in training mode (batch statistics)");
  if (!args.given(3, "running_mean") || !args.given(4, "running_var")) reject("batch norm without running statistics");
}

std::vector<ValueId> convert_bn_training_flag(ImportContext& cx) { return {batch_norm(cx, 3, 7)}; }

// native_layer_norm(input, normalized_shape, weight?, bias?, eps)
void check_layer_norm(const NodeArgs& args) {
  check_stats_unused(args);
  const std::vector<int64_t> norm = args.get_ints(1, "normalized_shape");
  const std::vector<int64_t>& shape = args.tensor_arg(0, "input").shape;
  const bool trailing = norm.size() <= shape.size() &&
                        std::equal(norm.begin(), norm.end(), shape.end() - std::ptrdiff_t(norm.size()));
  if (!trailing) reject("normalized_shape ", shape_str(norm), " is not the trailing dims of ", shape_str(shape));
}

std::vector<ValueId> convert_layer_norm(ImportContext& cx) {
  ValueId x = cx.input(0, "input");
  const DType dt = cx.type(x).dtype;
  auto w = cx.opt_input(2, "weight"), b = cx.opt_input(3, "bias");
  std::vector<ValueId> in = {x, w ? cx.cast(*w, dt) : kNoValue, b ? cx.cast(*b, dt) : kNoValue};
  while (in.back() == kNoValue) in.pop_back();
  Attrs a;
  a.set("normalized_rank", int64_t(cx.args.get_ints(1, "normalized_shape").size()));
  a.set("eps", cx.args.get_float(4, "eps"));
  return {cx.add(OpKind::kLayerNorm, in, a)};
}

// _fused_rms_norm(input, normalized_shape, weight?, eps?) -> (out, rstd): layer_norm {rms}. An eps
// not given is the epsilon of the type PyTorch computes in (float for f16 / bf16 / f32).
std::vector<ValueId> convert_fused_rms_norm(ImportContext& cx) {
  ValueId x = cx.input(0, "input");
  const DType dt = cx.type(x).dtype;
  std::vector<ValueId> in = {x};
  if (auto w = cx.opt_input(2, "weight")) in.push_back(cx.cast(*w, dt));
  Attrs a;
  a.set("normalized_rank", int64_t(cx.args.get_ints(1, "normalized_shape").size()));
  a.set("eps", cx.args.get_float(3, "eps",
                                 dt == DType::kF64 ? std::numeric_limits<double>::epsilon()
                                                   : double(std::numeric_limits<float>::epsilon())));
  a.set("rms", true);
  return {cx.add(OpKind::kLayerNorm, in, a)};
}

// native_group_norm(input, weight?, bias?, N, C, HxW, group, eps)
std::vector<ValueId> convert_group_norm(ImportContext& cx) {
  ValueId x = cx.input(0, "input");
  const DType dt = cx.type(x).dtype;
  auto w = cx.opt_input(1, "weight"), b = cx.opt_input(2, "bias");
  std::vector<ValueId> in = {x, w ? cx.cast(*w, dt) : kNoValue, b ? cx.cast(*b, dt) : kNoValue};
  while (in.back() == kNoValue) in.pop_back();
  Attrs a;
  a.set("groups", cx.args.get_int(6, "group"));
  a.set("eps", cx.args.get_float(7, "eps"));
  return {cx.add(OpKind::kGroupNorm, in, a)};
}

}  // namespace

std::vector<ImportEntry> norm_importers() {
  return {
      {"aten._native_batch_norm_legit_no_training.default", &check_stats_unused, &convert_bn_no_training},
      {"aten._native_batch_norm_legit.default", &check_bn_training, &convert_bn_training_flag},
      {"aten.native_batch_norm.default", &check_bn_training, &convert_bn_training_flag},
      {"aten.native_layer_norm.default", &check_layer_norm, &convert_layer_norm},
      {"aten._fused_rms_norm.default", &check_layer_norm, &convert_fused_rms_norm},
      {"aten.native_group_norm.default", &check_stats_unused, &convert_group_norm},
  };
}

}  // namespace kiln::aten
