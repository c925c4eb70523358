// Shape rules of the matmul family: matmul (numpy-style batched matrix product) and linear
// (x @ w^T + bias, PyTorch's nn.Linear, with the fused epilogue of src/ops/epilogue.h:
// act(x @ w^T + bias + residual)).
//
// Both take floating inputs of one dtype. Batch dims of matmul broadcast; the output keeps
// the Dim (symbol and range) of whichever operand supplies a dim, so dynamic batch sizes
// survive. 1-D operands are not accepted: importers add and remove the unit dims.
//
// matmul's optional a_view / b_view ([offset, size0, stride0, ...], as sdpa's operand views;
// set by fold_matmul_views) read an operand as a strided view of its input buffer: a permuted,
// sliced or broadcast operand without a copy. The view's sizes are the operand's logical dims.
// The optional float `alpha` (finite, default 1) scales the product in the GEMM's accumulator
// (y = alpha * a @ b): a scaled operand without a pass over it. The optional `out_perm` (as
// sdpa's, keeping the column dim last) writes the output permuted: the head merge after a
// batched product without a copy.
#include <algorithm>
#include <cmath>
#include <variant>

#include "src/ops/epilogue.h"
#include "src/ops/shape_rules.h"

namespace kiln {

namespace {

void check_floating(OpKind op, const char* what, const TensorType& t) {
  KILN_CHECK(is_floating(t.dtype), kInvalidArgument, op_name(op), ": ", what, " must be floating, got ",
             t.to_string());
}

void check_same_dtype(OpKind op, const char* what, const TensorType& t, const TensorType& first) {
  KILN_CHECK(t.dtype == first.dtype, kInvalidArgument, op_name(op), ": ", what, " ", t.to_string(),
             " must have the dtype of the first input ", first.to_string());
}

// numpy broadcasting of two dim lists (right-aligned), keeping symbols.
std::vector<Dim> broadcast_dims(OpKind op, const std::vector<Dim>& a, const std::vector<Dim>& b,
                                const TensorType& ta, const TensorType& tb) {
  size_t r = std::max(a.size(), b.size());
  std::vector<Dim> out(r);
  for (size_t i = 0; i < r; ++i) {
    const Dim* da = i < r - a.size() ? nullptr : &a[i - (r - a.size())];
    const Dim* db = i < r - b.size() ? nullptr : &b[i - (r - b.size())];
    if (!da || !db) {
      out[i] = da ? *da : *db;
    } else if (da->extent == db->extent) {
      out[i] = da->is_static() ? *db : *da;
    } else if (da->extent == 1) {
      out[i] = *db;
    } else if (db->extent == 1) {
      out[i] = *da;
    } else {
      KILN_FAIL(kShapeMismatch, op_name(op), ": batch dims of ", ta.to_string(), " and ", tb.to_string(),
                " do not broadcast (", da->extent, " vs ", db->extent, ")");
    }
  }
  return out;
}

std::vector<TensorType> infer_matmul_op(OpKind op, const TensorType& a, const TensorType& b) {
  check_floating(op, "a", a);
  check_same_dtype(op, "b", b, a);
  KILN_CHECK(a.rank() >= 2 && b.rank() >= 2, kShapeMismatch, op_name(op), ": both operands need rank >= 2, got ",
             a.to_string(), " and ", b.to_string());
  const Dim& k_a = a.dims[size_t(a.rank() - 1)];
  const Dim& k_b = b.dims[size_t(b.rank() - 2)];
  KILN_CHECK(k_a.extent == k_b.extent, kShapeMismatch, op_name(op), ": inner dims differ: ", a.to_string(), " @ ",
             b.to_string(), " (", k_a.extent, " vs ", k_b.extent, ")");
  std::vector<Dim> ba(a.dims.begin(), a.dims.end() - 2), bb(b.dims.begin(), b.dims.end() - 2);
  TensorType out;
  out.dtype = a.dtype;
  out.dims = broadcast_dims(op, ba, bb, a, b);
  out.dims.push_back(a.dims[size_t(a.rank() - 2)]);
  out.dims.push_back(b.dims[size_t(b.rank() - 1)]);
  return {out};
}

// The residual of linear: x's dtype, and broadcasting to the output without enlarging it.
void check_residual(OpKind op, const TensorType& r, const TensorType& out) {
  check_same_dtype(op, "residual", r, out);
  bool ok = r.rank() <= out.rank();
  for (int64_t i = 1; ok && i <= r.rank(); ++i) {
    const int64_t e = r.dims[size_t(r.rank() - i)].extent;
    ok = e == 1 || e == out.dims[size_t(out.rank() - i)].extent;
  }
  KILN_CHECK(ok, kShapeMismatch, op_name(op), ": residual ", r.to_string(), " does not broadcast to the output ",
             out.to_string());
}

std::vector<TensorType> infer_linear(OpKind op, const TypeList& in, const Attrs& a) {
  const TensorType& x = *in[0];
  const TensorType& w = *in[1];
  const TensorType* bias = in.size() > 2 ? in[2] : nullptr;
  const TensorType* residual = in.size() > 3 ? in[3] : nullptr;
  pw::parse_activation(op, a);
  check_floating(op, "x", x);
  check_same_dtype(op, "weight", w, x);
  KILN_CHECK(x.rank() >= 1, kShapeMismatch, op_name(op), ": x must have rank >= 1, got ", x.to_string());
  KILN_CHECK(w.rank() == 2, kShapeMismatch, op_name(op), ": weight must be [out_features, in_features], got ",
             w.to_string());
  int64_t k = x.dims.back().extent;
  KILN_CHECK(w.dims[1].extent == k, kShapeMismatch, op_name(op), ": x ", x.to_string(), " has ", k,
             " features, weight ", w.to_string(), " expects ", w.dims[1].extent);
  if (bias) {
    check_same_dtype(op, "bias", *bias, x);
    KILN_CHECK(bias->rank() == 1 && bias->dims[0].extent == w.dims[0].extent, kShapeMismatch, op_name(op),
               ": bias must be [", w.dims[0].extent, "], got ", bias->to_string());
  }
  TensorType out = x;
  out.dims.back() = w.dims[0];
  if (residual) check_residual(op, *residual, out);
  return {out};
}

}  // namespace

double matmul_alpha(const Attrs& a) {
  if (!a.has("alpha")) return 1.0;
  const auto* v = std::get_if<double>(&a.items().at("alpha"));
  KILN_CHECK(v != nullptr && std::isfinite(*v), kInvalidArgument, "matmul: attribute 'alpha' must be a finite float");
  return *v;
}

MatmulLayout matmul_layout(const TypeList& in, const Attrs& a) {
  MatmulLayout l;
  l.a = a.has("a_view") ? parse_operand_view(OpKind::kMatmul, a, "a_view", "a", *in[0], 2) : dense_view(*in[0]);
  l.b = a.has("b_view") ? parse_operand_view(OpKind::kMatmul, a, "b_view", "b", *in[1], 2) : dense_view(*in[1]);
  const TensorType y = infer_matmul_op(OpKind::kMatmul, l.a.logical, l.b.logical)[0];
  l.out_perm = out_perm_attr(OpKind::kMatmul, a, y.rank(), "column dim");
  l.y = permuted_output(y, l.out_perm);
  return l;
}

std::vector<int64_t> matmul_batch_strides(const std::vector<int64_t>& out_batch, const OperandView& v) {
  const std::vector<int64_t> shape = v.logical.shape();
  const size_t nb = shape.size() - 2;
  std::vector<int64_t> st(out_batch.size(), 0);
  for (size_t i = 0; i < nb; ++i) st[i + out_batch.size() - nb] = shape[i] == 1 ? 0 : v.strides[i];
  return st;
}

std::vector<TensorType> infer_matmul(OpKind op, const TypeList& in, const Attrs& a) {
  switch (op) {
    case OpKind::kMatmul: {
      matmul_alpha(a);
      if (!a.has("a_view") && !a.has("b_view") && !a.has("out_perm")) return infer_matmul_op(op, *in[0], *in[1]);
      const MatmulLayout l = matmul_layout(in, a);
      return {placed_type(l.y.logical, l.out_perm)};
    }
    case OpKind::kLinear: return infer_linear(op, in, a);
    default: KILN_FAIL(kInternal, op_name(op), " is not in the matmul family");
  }
}

}  // namespace kiln
