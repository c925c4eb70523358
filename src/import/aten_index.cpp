// Importers of indexing overloads: embedding, index_select, gather, index.Tensor and
// _unsafe_index.Tensor.
//
// index.Tensor (advanced indexing x[i0, i1, ...]) is taken when its index tensors are integer
// and sit on adjacent dims (None entries before them stand for ":"). k index tensors on dims
// [d, d+k) are combined into one linear index into those dims flattened (negative indices
// wrapped first), so the whole node is one index_select between two reshapes:
//   x[A.., D0..Dk-1, B..] -> [A.., D0*..*Dk-1, B..] -> index_select(axis = |A|) -> [A.., S.., B..]
// where S is the broadcast shape of the index tensors. Bool masks are refused: their result
// shape depends on the data. The kernel checks the combined index against the merged dim, so
// an out-of-range entry in any but the first of several index tensors is not caught (PyTorch
// raises; Kiln reads another element of the same tensor, never outside it).
//
// _unsafe_index.Tensor is index.Tensor without PyTorch's bounds check: what the Core ATen
// decompositions of bilinear and bicubic interpolation index with (index tensors [Ho, 1] and
// [Wo] on the last two dims, so one index_select of Ho * Wo entries of the flattened plane,
// whose linear index the builder folds to a constant). It imports the same way; Kiln's kernels
// keep their own range check.
#include <algorithm>

#include "src/import/import_context.h"

namespace kiln::aten {

namespace {

ValueId flat_index(ImportContext& cx, ValueId idx) { return cx.reshape(idx, {cx.type(idx).numel()}); }

void check_index_dtype(const ImportTensor& t, std::string_view what) {
  if (t.dtype != DType::kI64 && t.dtype != DType::kI32)
    reject(what, " of dtype ", dtype_name(t.dtype), " (integer indices only)");
}

// embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False): rows of
// weight, in the shape of indices plus the embedding dim.
std::vector<ValueId> convert_embedding(ImportContext& cx) {
  check_index_dtype(cx.args.tensor_arg(1, "indices"), "embedding indices");
  ValueId w = cx.input(0, "weight");
  if (cx.type(w).rank() != 2) reject("embedding weight must be 2-D, got ", cx.type(w).to_string());
  Attrs a;
  a.set("axis", int64_t{0});
  ValueId rows = cx.add(OpKind::kIndexSelect, {w, flat_index(cx, cx.input(1, "indices"))}, a);
  return {cx.reshape(rows, cx.args.out().shape)};
}

// index_select(self, dim, index): a 0-d index acts as a 1-element one.
std::vector<ValueId> convert_index_select(ImportContext& cx) {
  check_index_dtype(cx.args.tensor_arg(2, "index"), "index_select index");
  ValueId x = cx.input(0, "self");
  if (cx.type(x).rank() == 0) reject("index_select of a 0-d tensor");
  Attrs a;
  a.set("axis", normalize_dim(cx.args.get_int(1, "dim"), cx.type(x).rank()));
  ValueId y = cx.add(OpKind::kIndexSelect, {x, flat_index(cx, cx.input(2, "index"))}, a);
  return {cx.reshape(y, cx.args.out().shape)};
}

// gather(self, dim, index, *, sparse_grad=False)
std::vector<ValueId> convert_gather(ImportContext& cx) {
  check_index_dtype(cx.args.tensor_arg(2, "index"), "gather index");
  ValueId x = cx.input(0, "self");
  Attrs a;
  a.set("axis", normalize_dim(cx.args.get_int(1, "dim"), cx.type(x).rank()));
  return {cx.add(OpKind::kGather, {x, cx.input(2, "index")}, a)};
}

std::vector<int64_t> broadcast(std::vector<int64_t> a, std::vector<int64_t> b) {
  if (a.size() < b.size()) std::swap(a, b);
  b.insert(b.begin(), a.size() - b.size(), 1);
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i] || b[i] == 1) continue;
    if (a[i] != 1) reject("index tensors of shapes ", shape_str(a), " and ", shape_str(b), " do not broadcast");
    a[i] = b[i];
  }
  return a;
}

void check_index(const NodeArgs& args) {
  const std::vector<int32_t> ids = args.tensor_list(1, "indices");
  const size_t rank = args.tensor_arg(0, "self").shape.size();
  if (ids.size() > rank) reject("index with ", ids.size(), " indices into a ", rank, "-D tensor");
  auto first = std::find_if(ids.begin(), ids.end(), [](int32_t id) { return id >= 0; });
  if (first == ids.end()) reject("index without index tensors");
  auto last = std::find_if(ids.rbegin(), ids.rend(), [](int32_t id) { return id >= 0; }).base();
  if (std::find(first, last, -1) != last) reject("index tensors on non-adjacent dims");
  for (auto it = first; it != last; ++it) check_index_dtype(args.tensor(*it), "index tensor");
}

std::vector<ValueId> convert_index(ImportContext& cx) {
  const std::vector<int32_t> ids = cx.args.tensor_list(1, "indices");
  ValueId x = cx.input(0, "self");
  const std::vector<int64_t> xs = cx.type(x).shape();
  const size_t d0 = size_t(std::find_if(ids.begin(), ids.end(), [](int32_t id) { return id >= 0; }) - ids.begin());
  size_t k = 0;
  while (d0 + k < ids.size() && ids[d0 + k] >= 0) ++k;

  std::vector<int64_t> bshape;
  for (size_t j = 0; j < k; ++j) bshape = broadcast(bshape, cx.args.tensor(ids[d0 + j]).shape);

  ValueId linear;
  if (k == 1) {
    linear = cx.value(ids[d0]);  // index_select wraps negative indices itself
  } else {
    // sum_j wrap(i_j) * stride_j over the flattened dims d0 .. d0+k-1.
    int64_t stride = 1;
    std::optional<ValueId> acc;
    for (size_t j = k; j-- > 0;) {
      const int64_t dim = xs[d0 + j];
      ValueId i = cx.cast(cx.value(ids[d0 + j]), DType::kI64);
      ValueId zero = cx.scalar(0.0, DType::kI64);
      ValueId wrapped = cx.add(OpKind::kAdd, {i, cx.scalar(double(dim), DType::kI64)});
      i = cx.add(OpKind::kWhere, {cx.add(OpKind::kLt, {i, zero}), wrapped, i});
      if (stride != 1) i = cx.add(OpKind::kMul, {i, cx.scalar(double(stride), DType::kI64)});
      acc = acc ? cx.add(OpKind::kAdd, {*acc, i}) : i;
      stride *= dim;
    }
    linear = *acc;
  }
  int64_t count = 1;
  for (int64_t e : bshape) count *= e;
  linear = cx.reshape(linear, {count});

  std::vector<int64_t> flat(xs.begin(), xs.begin() + std::ptrdiff_t(d0));
  int64_t merged = 1;
  for (size_t j = 0; j < k; ++j) merged *= xs[d0 + j];
  flat.push_back(merged);
  flat.insert(flat.end(), xs.begin() + std::ptrdiff_t(d0 + k), xs.end());
  Attrs a;
  a.set("axis", int64_t(d0));
  ValueId y = cx.add(OpKind::kIndexSelect, {cx.reshape(x, flat), linear}, a);
  return {cx.reshape(y, cx.args.out().shape)};
}

}  // namespace

std::vector<ImportEntry> index_importers() {
  return {
      {"aten.embedding.default", nullptr, &convert_embedding},
      {"aten.index_select.default", nullptr, &convert_index_select},
      {"aten.gather.default", nullptr, &convert_gather},
      {"aten.index.Tensor", &check_index, &convert_index},
      {"aten._unsafe_index.Tensor", &check_index, &convert_index},
  };
}

}  // namespace kiln::aten
