// Shared access geometry of reductions, pooling and strided views (see access.h).
#include <algorithm>
#include <cstring>
#include <variant>

#include "kiln/errors.h"
#include "kiln/ops.h"
#include "src/common/element_access.h"
#include "src/ops/access.h"
#include "src/ops/checked.h"
#include "src/ops/shape_rules.h"

namespace kiln {

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t k = shape.size(); k-- > 1;) s[k - 1] = s[k] * shape[k];
  return s;
}

std::vector<int64_t> gather_index_strides(const Node& n, const Graph& g) {
  std::vector<int64_t> s = row_major_strides(g.type(n.inputs[1]).shape());
  for (int64_t d : n.attrs.get_ints("broadcast", {})) s.at(size_t(d)) = 0;
  return s;
}

ReduceLayout collapse_reduction(const std::vector<int64_t>& shape, const std::vector<char>& reduced) {
  struct D {
    int64_t extent, stride;
    bool red;
  };
  std::vector<D> rev, dims;
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1) rev.push_back({shape[i], stride, reduced[i] != 0});
    stride *= shape[i];
  }
  for (size_t i = rev.size(); i-- > 0;) {
    if (!dims.empty() && dims.back().red == rev[i].red) {
      dims.back().extent *= rev[i].extent;
      dims.back().stride = rev[i].stride;
    } else {
      dims.push_back(rev[i]);
    }
  }
  ReduceLayout L;
  if (!dims.empty()) {
    L.inner = dims.back().extent;
    L.inner_reduced = dims.back().red;
    dims.pop_back();
  }
  for (const D& d : dims) {
    (d.red ? L.red_shape : L.kept_shape).push_back(d.extent);
    (d.red ? L.red_stride : L.kept_stride).push_back(d.stride);
  }
  for (int64_t e : L.red_shape) L.count *= e;
  for (int64_t e : L.kept_shape) L.outputs *= e;
  (L.inner_reduced ? L.count : L.outputs) *= L.inner;
  return L;
}

PoolGeometry pool_geometry(const Node& n, const Graph& g) {
  PoolGeometry q;
  const bool nhwc = channels_last(n.op, n.attrs);
  const auto x = (nhwc ? channels_first_view(g.type(n.inputs[0])) : g.type(n.inputs[0])).shape();
  const auto y = (nhwc ? channels_first_view(g.type(n.outputs[0])) : g.type(n.outputs[0])).shape();
  const bool two_d = x.size() == 4;
  q.planes = x[0] * x[1];
  q.C = nhwc ? x[1] : 0;
  q.H = two_d ? x[2] : 1, q.W = x.back(), q.OH = two_d ? y[2] : 1, q.OW = y.back();
  if (n.op == OpKind::kAdaptiveAvgPool) return q;
  const size_t nsp = x.size() - 2;
  const Attrs& a = n.attrs;
  auto k = a.get_ints("kernel");
  auto s = a.get_ints("stride", k);
  if (s.empty()) s = k;
  auto p = a.get_ints("padding", std::vector<int64_t>(nsp, 0));
  auto d = a.get_ints("dilation", std::vector<int64_t>(nsp, 1));
  q.KW = k.back(), q.sw = s.back(), q.pw = p.back(), q.dw = d.back();
  if (two_d) q.KH = k[0], q.sh = s[0], q.ph = p[0], q.dh = d[0];
  return q;
}

StridedView strided_view(const Node& n, const Graph& g) {
  const auto x = g.type(n.inputs[0]).shape(), y = g.type(n.outputs[0]).shape();
  const std::vector<int64_t> xs = row_major_strides(x);
  StridedView v;
  v.strides.resize(y.size());
  if (n.op == OpKind::kPermute) {
    const auto& perm = n.attrs.get_ints("perm");
    for (size_t k = 0; k < y.size(); ++k) v.strides[k] = xs[size_t(perm[k])];
  } else if (n.op == OpKind::kExpand) {
    for (size_t k = 0; k < y.size(); ++k) v.strides[k] = x[k] == y[k] ? xs[k] : 0;
  } else {
    KILN_CHECK(n.op == OpKind::kSlice, kInternal, "strided_view of ", op_name(n.op));
    const auto axis = size_t(n.attrs.get_int("axis"));
    v.strides = xs;
    // A step only matters where the slice keeps several elements; then it is below the extent.
    const int64_t step = y[axis] > 1 ? n.attrs.get_int("step") : 1;
    const Checked ck(n.op, "the strided view's stride or offset");
    v.strides[axis] = ck.mul(v.strides[axis], step);
    v.offset = ck.mul(n.attrs.get_int("start"), xs[axis]);
  }
  return v;
}

PadInput pad_input(const Node& n, const Graph& g) {
  const auto x = g.type(n.inputs[0]).shape();
  PadInput v{x, row_major_strides(x)};
  if (!n.attrs.has("input_perm")) return v;
  PadInput p;
  for (int64_t d : n.attrs.get_ints("input_perm")) p.dims.push_back(v.dims[size_t(d)]), p.strides.push_back(v.strides[size_t(d)]);
  return p;
}

bool reads_input_in_order(const Node& n, const Graph& g) {
  if (n.op == OpKind::kReshape || n.op == OpKind::kCopy) return true;
  if (n.op != OpKind::kPermute && n.op != OpKind::kExpand && n.op != OpKind::kSlice) return false;
  const auto y = g.type(n.outputs[0]).shape();
  if (g.type(n.inputs[0]).numel() != g.type(n.outputs[0]).numel()) return false;
  const StridedView v = strided_view(n, g);
  const std::vector<int64_t> ys = row_major_strides(y);
  for (size_t k = 0; k < y.size(); ++k)
    if (y[k] > 1 && v.strides[k] != ys[k]) return false;
  return v.offset == 0;
}

uint64_t full_value_bits(const Attrs& attrs, DType t) {
  uint64_t bits = 0;
  const AttrValue& value = attrs.items().at("value");
  if (const int64_t* i = std::get_if<int64_t>(&value); i && t == DType::kI64) {
    std::memcpy(&bits, i, sizeof(int64_t));
  } else {
    store_double(&bits, t, 0, attrs.get_float("value"));
  }
  return bits;
}

MatrixLayout matrix_layout(int64_t R, int64_t C, int64_t rs, int64_t cs) {
  if ((C == 1 || cs == 1) && (R == 1 || rs >= C)) return {true, false, R == 1 ? std::max<int64_t>(C, 1) : rs};
  if ((R == 1 || rs == 1) && (C == 1 || cs >= R)) return {true, true, C == 1 ? std::max<int64_t>(R, 1) : cs};
  return {};
}

}  // namespace kiln
