// Importers of overloads that cut and join along one dim: slice / select / narrow, cat,
// split / split_with_sizes / chunk / unbind, constant_pad_nd (whose negative pads cut), and
// slice_scatter / select_scatter (the functional form of assigning to a slice).
//
// Bounds follow Python: negative indices count from the end and slice bounds are clamped, so
// the INT64_MAX "to the end" sentinel of FX is just the dim. Kiln's slice and split need
// normalized, in-range attributes, which these importers compute.
#include <algorithm>

#include "src/import/import_context.h"

namespace kiln::aten {

namespace {

ValueId slice(ImportContext& cx, ValueId x, int64_t axis, int64_t start, int64_t end, int64_t step) {
  const int64_t dim = cx.type(x).dims[size_t(axis)].extent;
  if (start == 0 && end == dim && step == 1) return x;
  Attrs a;
  a.set("axis", axis);
  a.set("start", start);
  a.set("end", end);
  a.set("step", step);
  return cx.add(OpKind::kSlice, {x}, a);
}

// Python slice bounds: negative counts from the end, then clamped to [0, dim] (so the
// INT64_MAX "to the end" sentinel is just dim).
int64_t clamp_bound(int64_t v, int64_t dim) {
  if (v < 0) v = v < -dim ? 0 : v + dim;
  return std::min(v, dim);
}

// slice.Tensor(self, dim=0, start=None, end=None, step=1)
std::vector<ValueId> convert_slice(ImportContext& cx) {
  const NodeArgs& args = cx.args;
  ValueId x = cx.input(0, "self");
  if (cx.type(x).rank() == 0) reject("slice of a 0-d tensor");
  const int64_t axis = normalize_dim(args.get_int(1, "dim", 0), cx.type(x).rank());
  const int64_t dim = cx.type(x).dims[size_t(axis)].extent;
  const int64_t step = args.get_int(4, "step", 1);
  if (step < 1) reject("slice step ", step, " (must be positive)");
  const int64_t start = clamp_bound(args.get_int(2, "start", 0), dim);
  const int64_t end = std::max(start, clamp_bound(args.get_int(3, "end", dim), dim));
  return {slice(cx, x, axis, start, end, step)};
}

// narrow(self, dim, start, length)
std::vector<ValueId> convert_narrow(ImportContext& cx) {
  ValueId x = cx.input(0, "self");
  const int64_t axis = normalize_dim(cx.args.get_int(1, "dim"), cx.type(x).rank());
  const int64_t dim = cx.type(x).dims[size_t(axis)].extent;
  int64_t start = cx.args.get_int(2, "start");
  const int64_t length = cx.args.get_int(3, "length");
  if (start < 0) start += dim;
  if (start < 0 || length < 0 || start + length > dim)
    reject("narrow start ", start, " length ", length, " out of range for dim ", dim);
  return {slice(cx, x, axis, start, start + length, 1)};
}

// select.int(self, dim, index): a one-element slice without its dim.
std::vector<ValueId> convert_select(ImportContext& cx) {
  ValueId x = cx.input(0, "self");
  if (cx.type(x).rank() == 0) reject("select of a 0-d tensor");
  const int64_t axis = normalize_dim(cx.args.get_int(1, "dim"), cx.type(x).rank());
  const int64_t dim = cx.type(x).dims[size_t(axis)].extent;
  int64_t index = cx.args.get_int(2, "index");
  if (index < -dim || index >= dim) reject("select index ", index, " out of range for dim ", dim);
  if (index < 0) index += dim;
  return {cx.reshape(slice(cx, x, axis, index, index + 1, 1), cx.args.out().shape)};
}

// cat(tensors, dim=0): inputs cast to the output dtype; legacy empty 1-D inputs are skipped.
std::vector<ValueId> convert_cat(ImportContext& cx) {
  const ImportTensor& out = cx.args.out();
  std::vector<ValueId> in;
  for (int32_t id : cx.args.tensor_list(0, "tensors")) {
    if (id < 0) reject("cat of a None tensor");
    const ImportTensor& t = cx.args.tensor(id);
    if (t.shape == std::vector<int64_t>{0} && out.shape.size() != 1) continue;
    in.push_back(cx.cast(cx.value(id), out.dtype));
  }
  if (in.empty()) reject("cat of only empty tensors");
  Attrs a;
  a.set("axis", normalize_dim(cx.args.get_int(1, "dim", 0), int64_t(out.shape.size())));
  return {in.size() == 1 ? in[0] : cx.add(OpKind::kConcat, in, a)};
}

// Kiln split along `axis` into `sizes`; the FX node must list one output per piece.
std::vector<ValueId> split(ImportContext& cx, ValueId x, int64_t axis, const std::vector<int64_t>& sizes) {
  if (sizes.size() != cx.args.num_outputs())
    reject("split into ", sizes.size(), " pieces, but the node lists ", cx.args.num_outputs(), " outputs");
  if (sizes.size() == 1) return {x};
  Attrs a;
  a.set("axis", axis);
  a.set("sizes", sizes);
  return cx.add_multi(OpKind::kSplit, {x}, a);
}

std::vector<int64_t> even_sizes(int64_t dim, int64_t piece) {
  if (piece <= 0) reject("split size ", piece, " (must be positive)");
  std::vector<int64_t> sizes;
  for (int64_t at = 0; at < dim; at += piece) sizes.push_back(std::min(piece, dim - at));
  if (sizes.empty()) sizes.push_back(0);
  return sizes;
}

// split.Tensor(self, split_size, dim=0)
std::vector<ValueId> convert_split(ImportContext& cx) {
  ValueId x = cx.input(0, "self");
  const int64_t axis = normalize_dim(cx.args.get_int(2, "dim", 0), cx.type(x).rank());
  return split(cx, x, axis, even_sizes(cx.type(x).dims[size_t(axis)].extent, cx.args.get_int(1, "split_size")));
}

// split_with_sizes(self, split_sizes, dim=0)
std::vector<ValueId> convert_split_with_sizes(ImportContext& cx) {
  ValueId x = cx.input(0, "self");
  const int64_t axis = normalize_dim(cx.args.get_int(2, "dim", 0), cx.type(x).rank());
  return split(cx, x, axis, cx.args.get_ints(1, "split_sizes"));
}

// chunk(self, chunks, dim=0): pieces of ceil(dim / chunks).
std::vector<ValueId> convert_chunk(ImportContext& cx) {
  ValueId x = cx.input(0, "self");
  const int64_t axis = normalize_dim(cx.args.get_int(2, "dim", 0), cx.type(x).rank());
  const int64_t chunks = cx.args.get_int(1, "chunks");
  if (chunks <= 0) reject("chunk count ", chunks);
  const int64_t dim = cx.type(x).dims[size_t(axis)].extent;
  return split(cx, x, axis, even_sizes(dim, std::max<int64_t>(1, (dim + chunks - 1) / chunks)));
}

// unbind.int(self, dim=0): one-element pieces without the dim.
std::vector<ValueId> convert_unbind(ImportContext& cx) {
  ValueId x = cx.input(0, "self");
  const int64_t axis = normalize_dim(cx.args.get_int(1, "dim", 0), cx.type(x).rank());
  const int64_t dim = cx.type(x).dims[size_t(axis)].extent;
  std::vector<ValueId> pieces = split(cx, x, axis, std::vector<int64_t>(size_t(dim), 1));
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (cx.args.out_used(i)) pieces[i] = cx.reshape(pieces[i], cx.args.out(i).shape);
  }
  return pieces;
}

// constant_pad_nd(self, pad, value=0): pad pairs run from the last dim backwards; negative
// pads crop (a slice), positive ones pad (Kiln's pad).
std::vector<ValueId> convert_constant_pad(ImportContext& cx) {
  ValueId x = cx.input(0, "self");
  const std::vector<int64_t> pad = cx.args.get_ints(1, "pad");
  const int64_t rank = cx.type(x).rank();
  if (pad.size() % 2 != 0 || int64_t(pad.size()) > 2 * rank)
    reject("pad ", shape_str(pad), " must have an even length of at most twice the rank ", rank);
  std::vector<int64_t> pads(size_t(2 * rank), 0);
  for (size_t i = 0; i < pad.size() / 2; ++i) {
    const int64_t d = rank - 1 - int64_t(i);
    const int64_t before = pad[2 * i], after = pad[2 * i + 1];
    const int64_t dim = cx.type(x).dims[size_t(d)].extent;
    const int64_t start = std::max<int64_t>(0, -before), end = dim - std::max<int64_t>(0, -after);
    if (end < start) reject("pad ", shape_str(pad), " crops dim ", d, " (", dim, ") below zero");
    x = slice(cx, x, d, start, end, 1);
    pads[size_t(2 * d)] = std::max<int64_t>(0, before);
    pads[size_t(2 * d + 1)] = std::max<int64_t>(0, after);
  }
  if (std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; })) return {x};
  Attrs a;
  a.set("pads", pads);
  a.set("mode", std::string("constant"));
  const ImportArg value = cx.args.given(2, "value") ? cx.args.get_scalar(2, "value") : ImportArg::of_int(0);
  if (value.kind == ImportArg::Kind::kInt) a.set("value", value.i);
  else a.set("value", cx.args.get_float(2, "value"));
  return {cx.add(OpKind::kPad, {x}, a)};
}

// slice_scatter(self, src, dim=0, start=None, end=None, step=1) / select_scatter(self, src, dim,
// index): self with a contiguous range of `dim` replaced by src, i.e. a concat of the part
// before, src and the part after (strided ranges are refused).
std::vector<ValueId> scatter_range(ImportContext& cx, int64_t axis, int64_t start, int64_t end) {
  const ImportTensor& out = cx.args.out();
  ValueId x = cx.cast(cx.input(0, "self"), out.dtype);
  std::vector<int64_t> piece = out.shape;
  piece[size_t(axis)] = end - start;
  ValueId src = cx.reshape(cx.cast(cx.input(1, "src"), out.dtype), piece);
  const int64_t dim = out.shape[size_t(axis)];
  std::vector<ValueId> parts;
  if (start > 0) parts.push_back(slice(cx, x, axis, 0, start, 1));
  if (end > start) parts.push_back(src);
  if (end < dim) parts.push_back(slice(cx, x, axis, end, dim, 1));
  if (parts.empty()) return {x};  // an empty dim
  if (parts.size() == 1) return {parts[0]};
  Attrs a;
  a.set("axis", axis);
  return {cx.add(OpKind::kConcat, parts, a)};
}

std::vector<ValueId> convert_slice_scatter(ImportContext& cx) {
  const NodeArgs& args = cx.args;
  const std::vector<int64_t>& shape = args.tensor_arg(0, "self").shape;
  if (shape.empty()) reject("slice_scatter into a 0-d tensor");
  const int64_t axis = normalize_dim(args.get_int(2, "dim", 0), int64_t(shape.size()));
  const int64_t dim = shape[size_t(axis)];
  const int64_t start = clamp_bound(args.get_int(3, "start", 0), dim);
  const int64_t end = std::max(start, clamp_bound(args.get_int(4, "end", dim), dim));
  const int64_t step = args.get_int(5, "step", 1);
  if (step != 1 && end - start > 1) reject("slice_scatter with step ", step, " (contiguous ranges only)");
  return scatter_range(cx, axis, start, end);
}

std::vector<ValueId> convert_select_scatter(ImportContext& cx) {
  const NodeArgs& args = cx.args;
  const std::vector<int64_t>& shape = args.tensor_arg(0, "self").shape;
  if (shape.empty()) reject("select_scatter into a 0-d tensor");
  const int64_t axis = normalize_dim(args.get_int(2, "dim"), int64_t(shape.size()));
  const int64_t dim = shape[size_t(axis)];
  int64_t index = args.get_int(3, "index");
  if (index < -dim || index >= dim) reject("select_scatter index ", index, " out of range for dim ", dim);
  if (index < 0) index += dim;
  return scatter_range(cx, axis, index, index + 1);
}

}  // namespace

std::vector<ImportEntry> slice_importers() {
  return {
      {"aten.slice.Tensor", nullptr, &convert_slice},
      {"aten.slice_copy.Tensor", nullptr, &convert_slice},
      {"aten.narrow.default", nullptr, &convert_narrow},
      {"aten.select.int", nullptr, &convert_select},
      {"aten.select_copy.int", nullptr, &convert_select},
      {"aten.cat.default", nullptr, &convert_cat},
      {"aten.split.Tensor", nullptr, &convert_split},
      {"aten.split_with_sizes.default", nullptr, &convert_split_with_sizes},
      {"aten.split_with_sizes_copy.default", nullptr, &convert_split_with_sizes},
      {"aten.chunk.default", nullptr, &convert_chunk},
      {"aten.unbind.int", nullptr, &convert_unbind},
      {"aten.constant_pad_nd.default", nullptr, &convert_constant_pad},
      {"aten.slice_scatter.default", nullptr, &convert_slice_scatter},
      {"aten.select_scatter.default", nullptr, &convert_select_scatter},
  };
}

}  // namespace kiln::aten
