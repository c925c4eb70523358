// Importers of the remaining overloads: tensor factories (arange, full, zeros, ones, the
// *_like and new_* forms, scalar_tensor), dtype conversion (_to_copy), softmax / log_softmax,
// inference-mode dropout and _assert_tensor_metadata.
//
// Factories take their shape and dtype from the FX output (PyTorch already resolved defaults
// and inference); device, layout and pin_memory arguments only place the tensor, and Kiln places
// everything on the engine's device. _to_copy is a dtype cast (see check_to_copy for devices).
#include "src/import/import_context.h"

namespace kiln::aten {

namespace {

void check_layout(const NodeArgs& args) {
  const std::string layout = args.get_string(kKwOnly, "layout", "torch.strided");
  if (layout != "torch.strided") reject("layout ", layout, " (dense tensors only)");
}

ValueId full(ImportContext& cx, const ImportArg& value) {
  const ImportTensor& out = cx.args.out();
  Attrs a;
  a.set("shape", out.shape);
  a.set("dtype", out.dtype);
  if (value.kind == ImportArg::Kind::kInt) a.set("value", value.i);
  else a.set("value", value.kind == ImportArg::Kind::kFloat ? value.f : (value.b ? 1.0 : 0.0));
  return cx.add(OpKind::kFull, {}, a);
}

template <int64_t kValue>
std::vector<ValueId> convert_constant_fill(ImportContext& cx) { return {full(cx, ImportArg::of_int(kValue))}; }

// full(size, fill_value), full_like(self, fill_value), new_full(self, size, fill_value).
template <size_t kValuePos>
std::vector<ValueId> convert_full(ImportContext& cx) { return {full(cx, cx.args.get_scalar(kValuePos, "fill_value"))}; }

std::vector<ValueId> convert_scalar_tensor(ImportContext& cx) { return {full(cx, cx.args.get_scalar(0, "s"))}; }

// arange(end) / arange.start(start, end) / arange.start_step(start, end, step=1)
template <int kArgs>
std::vector<ValueId> convert_arange(ImportContext& cx) {
  const NodeArgs& args = cx.args;
  Attrs a;
  a.set("start", kArgs == 1 ? 0.0 : args.get_float(0, "start"));
  a.set("end", kArgs == 1 ? args.get_float(0, "end") : args.get_float(1, "end"));
  a.set("step", kArgs == 3 ? args.get_float(2, "step", 1.0) : 1.0);
  a.set("dtype", args.out().dtype);
  return {cx.add(OpKind::kArange, {}, a)};
}

// _to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
// memory_format=None). Tensors carry no device in the description, so the decision is the
// node's own: a copy that names a device and keeps the dtype can only be there to move data
// between devices (PyTorch drops a no-op .to()), and is refused; a dtype conversion that also
// names a device (mask.to(device=d, dtype=torch.bool)) is taken as a cast on the engine's device.
void check_to_copy(const NodeArgs& args) {
  check_layout(args);
  if (!args.given(kKwOnly, "device")) return;
  const std::optional<DType> dt = args.get_dtype(kKwOnly, "dtype");
  if (!dt || *dt == args.tensor_arg(0, "self").dtype)
    reject("a device move to '", args.get_string(kKwOnly, "device", ""), "' (a copy that keeps the dtype)");
}

std::vector<ValueId> convert_to_copy(ImportContext& cx) { return {cx.cast(cx.input(0, "self"), cx.args.out().dtype)}; }

// _softmax(self, dim, half_to_float) / softmax.int(self, dim, dtype=None): the input is cast to
// the output dtype (half_to_float and dtype= both promote before the reduction).
template <OpKind K>
std::vector<ValueId> convert_softmax(ImportContext& cx) {
  ValueId x = cx.cast(cx.input(0, "self"), cx.args.out().dtype);
  const int64_t rank = cx.type(x).rank();
  const int64_t axis = normalize_dim(cx.args.get_int(1, "dim"), rank);
  if (rank == 0) return {full(cx, ImportArg::of_float(K == OpKind::kSoftmax ? 1.0 : 0.0))};  // one element
  Attrs a;
  a.set("axis", axis);
  return {cx.add(K, {x}, a)};
}

// _assert_tensor_metadata(a, size=None, stride=None, dtype=None, *, device, layout): no output;
// the assertion is decided here from the metadata.
void check_assert_metadata(const NodeArgs& args) {
  const ImportTensor& t = args.tensor_arg(0, "a");
  if (auto dt = args.get_dtype(3, "dtype"); dt && *dt != t.dtype)
    reject("_assert_tensor_metadata expects ", dtype_name(*dt), ", the tensor is ", dtype_name(t.dtype));
  if (args.given(1, "size") && args.get_ints(1, "size") != t.shape)
    reject("_assert_tensor_metadata expects size ", shape_str(args.get_ints(1, "size")), ", the tensor is ",
           shape_str(t.shape));
}

std::vector<ValueId> convert_nothing(ImportContext&) { return {}; }

// dropout(input, p, train) / native_dropout(input, p, train?) -> (out, mask): the identity in
// inference; training-mode dropout and a used mask are refused.
void check_dropout(const NodeArgs& args) {
  const double p = args.get_float(1, "p");
  if (args.get_bool(2, "train", false) && p != 0.0) reject("dropout with p ", p, " in training mode");
  args.require_unused(1, "mask");
}

std::vector<ValueId> convert_dropout(ImportContext& cx) { return {cx.input(0, "input")}; }

}  // namespace

std::vector<ImportEntry> misc_importers() {
  return {
      {"aten.arange.default", &check_layout, &convert_arange<1>},
      {"aten.arange.start", &check_layout, &convert_arange<2>},
      {"aten.arange.start_step", &check_layout, &convert_arange<3>},
      {"aten.full.default", &check_layout, &convert_full<1>},
      {"aten.full_like.default", &check_layout, &convert_full<1>},
      {"aten.new_full.default", &check_layout, &convert_full<2>},
      {"aten.scalar_tensor.default", &check_layout, &convert_scalar_tensor},
      {"aten.zeros.default", &check_layout, &convert_constant_fill<0>},
      {"aten.zeros_like.default", &check_layout, &convert_constant_fill<0>},
      {"aten.new_zeros.default", &check_layout, &convert_constant_fill<0>},
      {"aten.ones.default", &check_layout, &convert_constant_fill<1>},
      {"aten.ones_like.default", &check_layout, &convert_constant_fill<1>},
      {"aten.new_ones.default", &check_layout, &convert_constant_fill<1>},
      // Uninitialized memory may hold anything; zeros are as good as any.
      {"aten.empty.memory_format", &check_layout, &convert_constant_fill<0>},
      {"aten.empty_like.default", &check_layout, &convert_constant_fill<0>},
      {"aten.new_empty.default", &check_layout, &convert_constant_fill<0>},
      {"aten._to_copy.default", &check_to_copy, &convert_to_copy},
      {"aten._softmax.default", nullptr, &convert_softmax<OpKind::kSoftmax>},
      {"aten.softmax.int", nullptr, &convert_softmax<OpKind::kSoftmax>},
      {"aten._log_softmax.default", nullptr, &convert_softmax<OpKind::kLogSoftmax>},
      {"aten.log_softmax.int", nullptr, &convert_softmax<OpKind::kLogSoftmax>},
      {"aten._assert_tensor_metadata.default", &check_assert_metadata, &convert_nothing},
      {"aten.dropout.default", &check_dropout, &convert_dropout},
      {"aten.native_dropout.default", &check_dropout, &convert_dropout},
  };
}

}  // namespace kiln::aten
