// Importers of reductions: sum, mean, amax, amin, max / min (all and along a dim, with
// indices), var, var_mean, argmax, argmin, any, all, and cumsum (a triangular matmul).
//
// A dim list that is None or empty means every dim (Kiln's empty axes). The input is cast to
// the FX output's dtype first, which covers PyTorch's promotions (sum of bool or int -> i64,
// the dtype= keyword). Kiln has argmax only: argmin is argmax of -x (floating inputs). any / all
// are max / min over bool.
#include <algorithm>
#include <cstring>

#include "src/import/import_context.h"

namespace kiln::aten {

namespace {

// The dims argument at pos: None / absent / [] -> all (empty list), else normalized.
std::vector<int64_t> reduce_axes(const NodeArgs& args, size_t pos, std::string_view name, int64_t rank) {
  if (!args.given(pos, name)) return {};
  std::vector<int64_t> axes = normalize_dims(args.get_ints(pos, name), rank);
  if (rank == 0) axes.clear();  // dim 0 / -1 of a 0-d tensor: the tensor itself
  std::sort(axes.begin(), axes.end());
  return axes;
}

ValueId reduce(ImportContext& cx, OpKind op, ValueId x, const std::vector<int64_t>& axes, bool keepdim) {
  Attrs a;
  a.set("axes", axes);
  a.set("keepdim", keepdim);
  return cx.add(op, {x}, a);
}

ValueId self_as(ImportContext& cx, DType dt) { return cx.cast(cx.input(0, "self"), dt); }
int64_t self_rank(const NodeArgs& args) { return int64_t(args.tensor_arg(0, "self").shape.size()); }

// sum.dim_IntList / mean.dim (self, dim?, keepdim=False, *, dtype=None)
template <OpKind K>
std::vector<ValueId> convert_reduce_dims(ImportContext& cx) {
  const auto axes = reduce_axes(cx.args, 1, "dim", self_rank(cx.args));
  return {reduce(cx, K, self_as(cx, cx.args.out().dtype), axes, cx.args.get_bool(2, "keepdim", false))};
}

// sum.default / mean.default / max.default / min.default (self): every dim.
template <OpKind K>
std::vector<ValueId> convert_reduce_all(ImportContext& cx) {
  return {reduce(cx, K, self_as(cx, cx.args.out().dtype), {}, false)};
}

// amax / amin (self, dim=[], keepdim=False)
template <OpKind K>
std::vector<ValueId> convert_amax(ImportContext& cx) {
  const auto axes = reduce_axes(cx.args, 1, "dim", self_rank(cx.args));
  return {reduce(cx, K, self_as(cx, cx.args.out().dtype), axes, cx.args.get_bool(2, "keepdim", false))};
}

ValueId argmax(ImportContext& cx, ValueId x, int64_t axis, bool keepdim) {
  Attrs a;
  a.set("axis", axis);
  a.set("keepdim", keepdim);
  return cx.add(OpKind::kArgmax, {x}, a);
}

ValueId negate_for_argmin(ImportContext& cx, ValueId x) {
  if (!is_floating(cx.type(x).dtype)) reject("argmin of ", cx.type(x).to_string(), " (floating only)");
  return cx.add(OpKind::kNeg, {x});
}

// max.dim / min.dim (self, dim, keepdim=False) -> (values, indices)
template <bool kMax>
std::vector<ValueId> convert_max_dim(ImportContext& cx) {
  const NodeArgs& args = cx.args;
  ValueId x = cx.input(0, "self");
  const int64_t axis = normalize_dim(args.get_int(1, "dim"), cx.type(x).rank());
  const bool keepdim = args.get_bool(2, "keepdim", false);
  std::vector<ValueId> outs(2, kNoValue);
  if (cx.type(x).rank() == 0) {  // PyTorch returns x and index 0
    outs[0] = x;
    if (args.out_used(1)) outs[1] = cx.scalar(0.0, DType::kI64);
    return outs;
  }
  if (args.out_used(0)) outs[0] = reduce(cx, kMax ? OpKind::kReduceMax : OpKind::kReduceMin, x, {axis}, keepdim);
  if (args.out_used(1)) outs[1] = argmax(cx, kMax ? x : negate_for_argmin(cx, x), axis, keepdim);
  return outs;
}

// argmax / argmin (self, dim=None, keepdim=False); without dim over the flattened input.
template <bool kMax>
std::vector<ValueId> convert_argmax(ImportContext& cx) {
  ValueId x = cx.input(0, "self");
  if (!kMax) x = negate_for_argmin(cx, x);
  const bool keepdim = cx.args.get_bool(2, "keepdim", false);
  if (cx.args.given(1, "dim") && cx.type(x).rank() > 0)
    return {argmax(cx, x, normalize_dim(cx.args.get_int(1, "dim"), cx.type(x).rank()), keepdim)};
  ValueId flat = cx.reshape(x, {cx.type(x).numel()});
  return {cx.reshape(argmax(cx, flat, 0, false), cx.args.out().shape)};
}

// var.correction (self, dim=None, *, correction=None, keepdim=False); var_mean likewise.
double correction(const NodeArgs& args) { return args.get_float(kKwOnly, "correction", 1.0); }

std::vector<ValueId> convert_var(ImportContext& cx) {
  Attrs a;
  a.set("axes", reduce_axes(cx.args, 1, "dim", self_rank(cx.args)));
  a.set("keepdim", cx.args.get_bool(kKwOnly, "keepdim", false));
  a.set("correction", correction(cx.args));
  return {cx.add(OpKind::kReduceVar, {self_as(cx, cx.args.out().dtype)}, a)};
}

std::vector<ValueId> convert_var_mean(ImportContext& cx) {
  const auto axes = reduce_axes(cx.args, 1, "dim", self_rank(cx.args));
  const bool keepdim = cx.args.get_bool(kKwOnly, "keepdim", false);
  ValueId x = self_as(cx, cx.args.out(cx.args.out_used(0) ? 0 : 1).dtype);  // var and mean share it
  std::vector<ValueId> outs(2, kNoValue);
  if (cx.args.out_used(0)) {
    Attrs a;
    a.set("axes", axes);
    a.set("keepdim", keepdim);
    a.set("correction", correction(cx.args));
    outs[0] = cx.add(OpKind::kReduceVar, {x}, a);
  }
  if (cx.args.out_used(1)) outs[1] = reduce(cx, OpKind::kReduceMean, x, axes, keepdim);
  return outs;
}

// any / all: .dim (self, dim, keepdim), .dims (self, dim?, keepdim), .default (self).
template <bool kAny>
std::vector<ValueId> convert_any(ImportContext& cx) {
  const NodeArgs& args = cx.args;
  std::vector<int64_t> axes = reduce_axes(args, 1, "dim", self_rank(args));
  ValueId x = cx.cast(cx.input(0, "self"), DType::kBool);
  ValueId r = reduce(cx, kAny ? OpKind::kReduceMax : OpKind::kReduceMin, x, axes, args.get_bool(2, "keepdim", false));
  return {cx.cast(r, args.out().dtype)};
}

// cumsum(self, dim, *, dtype=None): a matmul with an upper-triangular matrix of ones over the
// scanned dim (moved last): a constant or, in a dynamic block, computed from indices. Integer
// outputs are summed in f64, exact below 2^53, or in f32 where the inputs are small integers
// (see below).
constexpr int64_t kMaxCumsumLength = 4096;  // the n x n constant stays below 128 MiB

// Whether every element of `v` is an integer of magnitude at most 255: a bool or 8-bit integer,
// or a cast of one (a padding mask made with `.ne(pad).int()`). Sums of up to kMaxCumsumLength of
// them stay below 2^24, exact in f32, which every backend's matmul takes (f64 not everywhere).
bool small_integers(const Graph& g, ValueId v) {
  const Value& value = g.value(v);
  const DType dt = value.type.dtype;
  if (dt == DType::kBool || dt == DType::kI8 || dt == DType::kU8) return true;
  const Node* p = value.producer;
  return !is_floating(dt) && p != nullptr && p->op == OpKind::kCast && small_integers(g, p->inputs[0]);
}

ValueId triangle_of_ones(ImportContext& cx, int64_t n, DType dt) {
  TensorType t(dt, {n, n});
  Bytes b(t.nbytes(), 0);
  const size_t esz = dtype_size(dt);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = i; j < n; ++j) {
      uint8_t* p = b.data() + size_t(i * n + j) * esz;
      if (dt == DType::kF64) { double one = 1.0; std::memcpy(p, &one, 8); }
      else if (dt == DType::kF32) { float one = 1.0f; std::memcpy(p, &one, 4); }
      else { uint16_t one = dt == DType::kF16 ? float_to_half(1.0f) : float_to_bf16(1.0f); std::memcpy(p, &one, 2); }
    }
  }
  return cx.graph.add_constant("", t, b.data(), b.size());
}

// The same triangle computed from the indices (i <= j), for a dynamic program's block, where n is
// a size of the range: a constant would differ at every size, and the range fit needs the plans to
// differ in integers only (kiln/size_program.h). The arange is sized, so fold_constants leaves it.
ValueId triangle_from_indices(ImportContext& cx, int64_t n, DType dt) {
  Attrs range;
  range.set("start", 0.0);
  range.set("end", double(n));
  range.set("step", 1.0);
  range.set("dtype", DType::kI64);
  const ValueId idx = cx.add(OpKind::kArange, {}, range);
  cx.graph.value(idx).sized = true;
  return cx.cast(cx.add(OpKind::kLe, {cx.reshape(idx, {n, 1}), cx.reshape(idx, {1, n})}), dt);
}

std::vector<ValueId> convert_cumsum(ImportContext& cx) {
  const DType out = cx.args.out().dtype;
  ValueId x = cx.input(0, "self");
  const std::vector<int64_t> shape = cx.type(x).shape();
  if (shape.empty()) return {cx.cast(x, out)};
  const int64_t rank = int64_t(shape.size());
  const int64_t axis = normalize_dim(cx.args.get_int(1, "dim"), rank);
  const int64_t n = shape[size_t(axis)];
  if (n > kMaxCumsumLength) reject("cumsum over ", n, " elements (at most ", kMaxCumsumLength, ")");
  const DType compute = is_floating(out) ? out : small_integers(cx.graph, x) ? DType::kF32 : DType::kF64;
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < rank; ++d) {
    if (d != axis) perm.push_back(d);
  }
  perm.push_back(axis);
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[size_t(perm[i])] = int64_t(i);
  ValueId moved = cx.permute(cx.cast(x, compute), perm);
  std::vector<int64_t> moved_shape = cx.type(moved).shape();
  ValueId m = rank == 1 ? cx.reshape(moved, {1, n}) : moved;
  const ValueId ones =
      cx.args.tensor_arg(0, "self").sized ? triangle_from_indices(cx, n, compute) : triangle_of_ones(cx, n, compute);
  ValueId sums = cx.reshape(cx.add(OpKind::kMatmul, {m, ones}), moved_shape);
  return {cx.cast(cx.permute(sums, inverse), out)};
}

}  // namespace

std::vector<ImportEntry> reduce_importers() {
  return {
      {"aten.sum.dim_IntList", nullptr, &convert_reduce_dims<OpKind::kReduceSum>},
      {"aten.sum.default", nullptr, &convert_reduce_all<OpKind::kReduceSum>},
      {"aten.mean.dim", nullptr, &convert_reduce_dims<OpKind::kReduceMean>},
      {"aten.mean.default", nullptr, &convert_reduce_all<OpKind::kReduceMean>},
      {"aten.amax.default", nullptr, &convert_amax<OpKind::kReduceMax>},
      {"aten.amin.default", nullptr, &convert_amax<OpKind::kReduceMin>},
      {"aten.max.default", nullptr, &convert_reduce_all<OpKind::kReduceMax>},
      {"aten.min.default", nullptr, &convert_reduce_all<OpKind::kReduceMin>},
      {"aten.max.dim", nullptr, &convert_max_dim<true>},
      {"aten.min.dim", nullptr, &convert_max_dim<false>},
      {"aten.argmax.default", nullptr, &convert_argmax<true>},
      {"aten.argmin.default", nullptr, &convert_argmax<false>},
      {"aten.var.correction", nullptr, &convert_var},
      {"aten.var_mean.correction", nullptr, &convert_var_mean},
      {"aten.any.dim", nullptr, &convert_any<true>},
      {"aten.any.dims", nullptr, &convert_any<true>},
      {"aten.any.default", nullptr, &convert_any<true>},
      {"aten.all.dim", nullptr, &convert_any<false>},
      {"aten.all.dims", nullptr, &convert_any<false>},
      {"aten.all.default", nullptr, &convert_any<false>},
      {"aten.cumsum.default", nullptr, &convert_cumsum},
  };
}

}  // namespace kiln::aten
