// Importers of view and layout overloads: aliases, view / reshape / flatten / squeeze /
// unsqueeze, permute / transpose / t, expand, copy, repeat, and as_strided when it is a reshape
// or a permute in disguise.
//
// Kiln values are dense, so a view is the op that produces the view's elements: every
// reshape-like overload becomes reshape to the FX output's shape (which has -1 resolved and
// squeezed / unsqueezed dims in place), an alias becomes the same value. Strides of the FX
// metadata play no part, except for as_strided. The *_copy overloads (functionalized views)
// share the importers.
#include <algorithm>

#include "src/import/import_context.h"

namespace kiln::aten {

namespace {

std::vector<ValueId> convert_identity(ImportContext& cx) { return {cx.input(0, "self")}; }

std::vector<ValueId> convert_reshape(ImportContext& cx) {
  return {cx.reshape(cx.input(0, "self"), cx.args.out().shape)};
}

std::vector<ValueId> convert_permute(ImportContext& cx) {
  ValueId x = cx.input(0, "self");
  return {cx.permute(x, normalize_dims(cx.args.get_ints(1, "dims"), cx.type(x).rank()))};
}

std::vector<int64_t> swap_perm(int64_t rank, int64_t a, int64_t b) {
  std::vector<int64_t> perm(static_cast<size_t>(rank));
  for (int64_t i = 0; i < rank; ++i) perm[size_t(i)] = i;
  std::swap(perm[size_t(a)], perm[size_t(b)]);
  return perm;
}

std::vector<ValueId> convert_transpose(ImportContext& cx) {
  ValueId x = cx.input(0, "self");
  const int64_t r = cx.type(x).rank();
  if (r == 0) return {x};
  const int64_t a = normalize_dim(cx.args.get_int(1, "dim0"), r), b = normalize_dim(cx.args.get_int(2, "dim1"), r);
  return {cx.permute(x, swap_perm(r, a, b))};
}

void check_t(const NodeArgs& args) {
  if (args.tensor_arg(0, "self").shape.size() > 2) reject("t of a tensor with more than 2 dims");
}

std::vector<ValueId> convert_t(ImportContext& cx) {
  ValueId x = cx.input(0, "self");
  return {cx.type(x).rank() < 2 ? x : cx.permute(x, {1, 0})};
}

// expand: new leading dims first (a reshape), then Kiln's same-rank expand to the FX shape.
ValueId expand_to(ImportContext& cx, ValueId x, const std::vector<int64_t>& shape) {
  std::vector<int64_t> s = cx.type(x).shape();
  if (s.size() > shape.size()) reject("expand of ", shape_str(s), " to the lower rank ", shape_str(shape));
  s.insert(s.begin(), shape.size() - s.size(), 1);
  x = cx.reshape(x, s);
  if (s == shape) return x;
  Attrs a;
  a.set("shape", shape);
  return cx.add(OpKind::kExpand, {x}, a);
}

std::vector<ValueId> convert_expand(ImportContext& cx) {
  return {expand_to(cx, cx.input(0, "self"), cx.args.out().shape)};
}

// copy(self, src, non_blocking=False): src broadcast to self's shape, in self's dtype.
std::vector<ValueId> convert_copy(ImportContext& cx) {
  const ImportTensor& out = cx.args.out();
  return {expand_to(cx, cx.cast(cx.input(1, "src"), out.dtype), out.shape)};
}

// repeat(self, repeats): x viewed as [1, s0, 1, s1, ...], expanded to [r0, s0, r1, s1, ...].
// The expanded value has the output's elements: sized where the output is (a weight-derived
// table repeated per batch row stays a node in a dynamic program, not a constant of one batch).
std::vector<ValueId> convert_repeat(ImportContext& cx) {
  ValueId x = cx.input(0, "self");
  const std::vector<int64_t> reps = cx.args.get_ints(1, "repeats");
  std::vector<int64_t> s = cx.type(x).shape();
  if (reps.size() < s.size()) reject("repeat with fewer repeats ", shape_str(reps), " than dims ", shape_str(s));
  s.insert(s.begin(), reps.size() - s.size(), 1);
  std::vector<int64_t> inter, expanded;
  for (size_t i = 0; i < s.size(); ++i) {
    if (reps[i] < 0) reject("repeat count ", reps[i]);
    inter.insert(inter.end(), {1, s[i]});
    expanded.insert(expanded.end(), {reps[i], s[i]});
  }
  x = expand_to(cx, cx.reshape(x, inter), expanded);
  if (cx.args.out().sized && !cx.graph.value(x).is_constant()) cx.graph.value(x).sized = true;
  return {cx.reshape(x, cx.args.out().shape)};
}

// Strides of a row-major tensor of `shape`.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> st(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) st[i - 1] = st[i] * shape[i];
  return st;
}

// Strides agree with row-major order on every dim of extent > 1 (unit dims' strides do not
// matter).
bool is_contiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  if (strides.empty()) return true;
  if (strides.size() != shape.size()) return false;
  const std::vector<int64_t> want = contiguous_strides(shape);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] != 1 && strides[i] != want[i]) return false;
  }
  return true;
}

// as_strided(self, size, stride, storage_offset=None): taken when it re-reads a contiguous input
// as a permutation of a row-major layout (a reshape, maybe followed by a permute); anything
// else (overlapping windows, offsets, gaps) is refused.
struct StridedView {
  std::vector<int64_t> order;  // non-unit output dims by decreasing stride
};

std::optional<StridedView> strided_view(const NodeArgs& args, std::string* why) {
  const ImportTensor& x = args.tensor_arg(0, "self");
  const std::vector<int64_t> size = args.get_ints(1, "size"), stride = args.get_ints(2, "stride");
  auto fail = [&](const std::string& reason) {
    *why = reason;
    return std::nullopt;
  };
  if (size.size() != stride.size()) return fail("size and stride differ in length");
  if (args.get_int(3, "storage_offset", 0) != 0) return fail("a non-zero storage_offset");
  if (!is_contiguous(x.shape, x.strides)) return fail("a non-contiguous input");
  int64_t numel = 1, in_numel = 1;
  for (int64_t e : size) numel *= e;
  for (int64_t e : x.shape) in_numel *= e;
  StridedView v;
  for (size_t k = 0; k < size.size(); ++k) {
    if (size[k] != 1) v.order.push_back(int64_t(k));
  }
  std::stable_sort(v.order.begin(), v.order.end(),
                   [&](int64_t a, int64_t b) { return stride[size_t(a)] > stride[size_t(b)]; });
  if (numel == 0) return v;
  int64_t expected = 1;
  for (size_t i = v.order.size(); i-- > 0;) {
    const size_t k = size_t(v.order[i]);
    if (stride[k] != expected) return fail("strides that are not a permuted row-major layout");
    expected *= size[k];
  }
  if (expected != in_numel) return fail("a view of part of the input");
  return v;
}

void check_as_strided(const NodeArgs& args) {
  std::string why;
  if (!strided_view(args, &why)) reject("as_strided with ", why);
}

std::vector<ValueId> convert_as_strided(ImportContext& cx) {
  std::string why;
  auto view = strided_view(cx.args, &why);
  if (!view) reject("as_strided with ", why);
  const std::vector<int64_t> size = cx.args.get_ints(1, "size");
  ValueId x = cx.input(0, "self");
  if (cx.type(x).numel() == 0) return {cx.reshape(x, size)};
  // Read the storage in stride order, then put the dims where the view wants them.
  std::vector<int64_t> sorted_shape, perm(view->order.size());
  for (int64_t k : view->order) sorted_shape.push_back(size[size_t(k)]);
  std::vector<int64_t> by_position = view->order;
  std::sort(by_position.begin(), by_position.end());
  for (size_t i = 0; i < by_position.size(); ++i)
    perm[i] = std::find(view->order.begin(), view->order.end(), by_position[i]) - view->order.begin();
  if (std::is_sorted(view->order.begin(), view->order.end())) return {cx.reshape(x, size)};  // no permute
  x = cx.permute(cx.reshape(x, sorted_shape), perm);
  return {cx.reshape(x, size)};
}

}  // namespace

std::vector<ImportEntry> shape_importers() {
  return {
      {"aten.clone.default", nullptr, &convert_identity},
      {"aten.alias.default", nullptr, &convert_identity},
      {"aten.alias_copy.default", nullptr, &convert_identity},
      {"aten.detach.default", nullptr, &convert_identity},
      {"aten.detach_copy.default", nullptr, &convert_identity},
      {"aten.lift_fresh_copy.default", nullptr, &convert_identity},
      {"aten.contiguous.default", nullptr, &convert_identity},
      {"aten.view.default", nullptr, &convert_reshape},
      {"aten.view_copy.default", nullptr, &convert_reshape},
      {"aten._unsafe_view.default", nullptr, &convert_reshape},
      {"aten.reshape.default", nullptr, &convert_reshape},
      {"aten.flatten.using_ints", nullptr, &convert_reshape},
      {"aten.unflatten.int", nullptr, &convert_reshape},
      {"aten.squeeze.default", nullptr, &convert_reshape},
      {"aten.squeeze.dim", nullptr, &convert_reshape},
      {"aten.squeeze.dims", nullptr, &convert_reshape},
      {"aten.squeeze_copy.dims", nullptr, &convert_reshape},
      {"aten.unsqueeze.default", nullptr, &convert_reshape},
      {"aten.unsqueeze_copy.default", nullptr, &convert_reshape},
      {"aten.permute.default", nullptr, &convert_permute},
      {"aten.permute_copy.default", nullptr, &convert_permute},
      {"aten.transpose.int", nullptr, &convert_transpose},
      {"aten.transpose_copy.int", nullptr, &convert_transpose},
      {"aten.t.default", &check_t, &convert_t},
      {"aten.t_copy.default", &check_t, &convert_t},
      {"aten.expand.default", nullptr, &convert_expand},
      {"aten.expand_copy.default", nullptr, &convert_expand},
      {"aten.repeat.default", nullptr, &convert_repeat},
      {"aten.copy.default", nullptr, &convert_copy},
      {"aten.as_strided.default", &check_as_strided, &convert_as_strided},
      {"aten.as_strided_copy.default", &check_as_strided, &convert_as_strided},
  };
}

}  // namespace kiln::aten
