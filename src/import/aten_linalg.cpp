// Importers of matrix products: mm, bmm, matmul, addmm, baddbmm, linear.
//
// nn.Linear reaches Core ATen as addmm(bias, x, permute(w, [1, 0])) (or mm without a bias).
// When the right operand is the output of a [1, 0] permute the importer emits Kiln's linear on
// the untransposed weight instead: the weight keeps its layout and name (so it stays
// refittable, and no transposed copy is folded into the engine), and the GEMM gets its bias
// as an epilogue. The left-over permute has no use and is dropped by dead code elimination.
// addmm with a constant [K, N] right operand also becomes a linear, on the operand's transpose.
#include "src/import/import_context.h"

namespace kiln::aten {

namespace {

// w when v = permute(w, [1, 0]) with w 2-D.
std::optional<ValueId> transposed_source(const Graph& g, ValueId v) {
  const Node* p = g.value(v).producer;
  if (!p || p->op != OpKind::kPermute || p->inputs.size() != 1 || !p->attrs.has("perm")) return std::nullopt;
  if (p->attrs.get_ints("perm") != std::vector<int64_t>{1, 0}) return std::nullopt;
  return p->inputs[0];
}

// A weight or other constant of the model (bytes or not): no producer, not a graph input.
bool is_model_constant(const Graph& g, ValueId v) { return !g.value(v).producer && !g.value(v).is_input; }

bool is_one(const ImportArg& a) {
  return (a.kind == ImportArg::Kind::kInt && a.i == 1) || (a.kind == ImportArg::Kind::kFloat && a.f == 1.0) ||
         (a.kind == ImportArg::Kind::kBool && a.b);
}

bool is_zero(const ImportArg& a) {
  return (a.kind == ImportArg::Kind::kInt && a.i == 0) || (a.kind == ImportArg::Kind::kFloat && a.f == 0.0) ||
         (a.kind == ImportArg::Kind::kBool && !a.b);
}

ImportArg factor(const NodeArgs& args, std::string_view name) {
  return args.given(kKwOnly, name) ? args.get_scalar(kKwOnly, name) : ImportArg::of_int(1);
}

std::vector<ValueId> convert_mm(ImportContext& cx) {
  ValueId a = cx.input(0, "self");
  ValueId b = cx.input(1, "mat2");
  if (auto w = transposed_source(cx.graph, b)) return {cx.add(OpKind::kLinear, {a, *w})};
  return {cx.add(OpKind::kMatmul, {a, b})};
}

// addmm / baddbmm: beta * self + alpha * (m1 @ m2). beta = 0 ignores self (NaNs included).
std::vector<ValueId> convert_addmm_like(ImportContext& cx, std::string_view m1_name, std::string_view m2_name) {
  const DType dt = cx.args.out().dtype;
  ValueId self = cx.cast(cx.input(0, "self"), dt);
  ValueId m1 = cx.input(1, m1_name), m2 = cx.input(2, m2_name);
  const ImportArg beta = factor(cx.args, "beta"), alpha = factor(cx.args, "alpha");
  const TensorType& st = cx.type(self);
  if (is_one(beta) && is_one(alpha) && st.rank() == 1 && cx.type(m1).rank() == 2) {
    if (auto w = transposed_source(cx.graph, m2)) {
      if (cx.type(*w).rank() == 2 && st.dims[0].extent == cx.type(*w).dims[0].extent)
        return {cx.add(OpKind::kLinear, {m1, *w, self})};
    } else if (is_model_constant(cx.graph, m2) && cx.type(m2).rank() == 2 &&
               st.dims[0].extent == cx.type(m2).dims[1].extent) {
      // A constant [K, N] right operand (GPT-2's Conv1D): linear on its transpose, which
      // fold_constants turns into a constant, so the bias joins the GEMM's epilogue.
      return {cx.add(OpKind::kLinear, {m1, cx.permute(m2, {1, 0}), self})};
    }
  }
  ValueId prod = cx.scale(cx.add(OpKind::kMatmul, {m1, m2}), alpha);
  if (is_zero(beta)) return {prod};
  return {cx.add(OpKind::kAdd, {prod, cx.scale(self, beta)})};
}

std::vector<ValueId> convert_addmm(ImportContext& cx) { return convert_addmm_like(cx, "mat1", "mat2"); }
std::vector<ValueId> convert_baddbmm(ImportContext& cx) { return convert_addmm_like(cx, "batch1", "batch2"); }

std::vector<ValueId> convert_bmm(ImportContext& cx) {
  return {cx.add(OpKind::kMatmul, {cx.input(0, "self"), cx.input(1, "mat2")})};
}

std::vector<ValueId> convert_linear(ImportContext& cx) {
  std::vector<ValueId> in = {cx.input(0, "input"), cx.input(1, "weight")};
  if (auto b = cx.opt_input(2, "bias")) in.push_back(*b);
  return {cx.add(OpKind::kLinear, in)};
}

// torch.matmul: 1-D operands get a unit dim (prepended to a, appended to b) that the result
// drops again.
std::vector<ValueId> convert_matmul(ImportContext& cx) {
  ValueId a = cx.input(0, "self"), b = cx.input(1, "other");
  std::vector<int64_t> as = cx.type(a).shape(), bs = cx.type(b).shape();
  if (as.empty() || bs.empty()) reject("matmul of a 0-d tensor");
  if (as.size() == 1) a = cx.reshape(a, {1, as[0]});
  if (bs.size() == 1) b = cx.reshape(b, {bs[0], 1});
  return {cx.reshape(cx.add(OpKind::kMatmul, {a, b}), cx.args.out().shape)};
}

}  // namespace

std::vector<ImportEntry> linalg_importers() {
  return {
      {"aten.mm.default", nullptr, &convert_mm},
      {"aten.bmm.default", nullptr, &convert_bmm},
      {"aten.matmul.default", nullptr, &convert_matmul},
      {"aten.addmm.default", nullptr, &convert_addmm},
      {"aten.baddbmm.default", nullptr, &convert_baddbmm},
      {"aten.linear.default", nullptr, &convert_linear},
  };
}

}  // namespace kiln::aten
