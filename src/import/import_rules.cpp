// The rules importers share: PyTorch's dim wrapping and type promotion (torch.promote_types,
// torch.result_type with its priority of tensors with dims over 0-d tensors over Python
// scalars), and FX metadata -> Kiln types.
#include "src/import/import_context.h"

namespace kiln::aten {

int64_t normalize_dim(int64_t d, int64_t rank, std::string_view what) {
  const int64_t r = rank == 0 ? 1 : rank;
  if (d < -r || d >= r) reject(what, " ", d, " out of range [", -r, ", ", r, ")");
  return d < 0 ? d + r : d;
}

std::vector<int64_t> normalize_dims(const std::vector<int64_t>& dims, int64_t rank, std::string_view what) {
  std::vector<int64_t> out;
  std::vector<bool> seen(size_t(rank == 0 ? 1 : rank), false);
  for (int64_t d : dims) {
    int64_t n = normalize_dim(d, rank, what);
    if (seen[size_t(n)]) reject(what, " ", d, " appears twice in ", shape_str(dims));
    seen[size_t(n)] = true;
    out.push_back(n);
  }
  return out;
}

std::string shape_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s + "]";
}

TensorType tensor_type(const ImportTensor& t) {
  TensorType type(t.dtype, t.shape);
  for (size_t i = 0; i < t.symbols.size() && i < type.dims.size(); ++i) {
    if (t.symbols[i].empty()) continue;
    Dim& d = type.dims[i];
    d.symbol = t.symbols[i];
    d.min = i < t.sym_min.size() ? t.sym_min[i] : d.extent;
    d.max = i < t.sym_max.size() ? t.sym_max[i] : d.extent;
  }
  return type;
}

namespace {

int category(DType t) { return t == DType::kBool ? 0 : is_integral(t) ? 1 : 2; }

int int_rank(DType t) {
  switch (t) {
    case DType::kU8: case DType::kI8: return 0;
    case DType::kI32: return 2;
    default: return 3;  // i64
  }
}

}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  const int ca = category(a), cb = category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 2) {
    if (a == DType::kF64 || b == DType::kF64) return DType::kF64;
    return DType::kF32;  // f32 with a 16-bit float, or f16 with bf16
  }
  // Both integral and different.
  if ((a == DType::kU8 && b == DType::kI8) || (a == DType::kI8 && b == DType::kU8))
    reject("uint8 with int8 promotes to int16, which Kiln does not have");
  return int_rank(a) >= int_rank(b) ? a : b;
}

Operand operand_of(const ImportTensor& t) {
  return {t.dtype, t.shape.empty() ? Operand::Kind::kZeroDim : Operand::Kind::kTensor};
}

Operand operand_of(const ImportArg& s) {
  DType dt = s.kind == ImportArg::Kind::kBool ? DType::kBool
             : s.kind == ImportArg::Kind::kInt ? DType::kI64
                                               : DType::kF32;
  return {dt, Operand::Kind::kScalar};
}

DType result_type(const std::vector<Operand>& ops) {
  // Per priority group (tensors with dims, 0-d tensors, scalars): the promoted dtype.
  std::optional<DType> group[3];
  for (const Operand& o : ops) {
    auto& g = group[int(o.kind)];
    g = g ? promote_types(*g, o.dtype) : o.dtype;
  }
  std::optional<DType> result = group[0];
  if (group[1] && (!result || category(*group[1]) > category(*result))) result = group[1];
  if (group[2] && (!result || category(*group[2]) > category(*result))) {
    // A Python scalar of a higher category gives that category's default dtype.
    const int c = category(*group[2]);
    result = c == 0 ? DType::kBool : c == 1 ? DType::kI64 : DType::kF32;
  }
  if (!result) reject("no operands to promote");
  return *result;
}

}  // namespace kiln::aten
