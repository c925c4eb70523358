// CUDA kernels of the gather family (gather, index_select; embedding lookups import as
// index_select on axis 0), generated and compiled by NVRTC. Elements move as opaque words.
//
//   gather:       one thread per output element (rank <= 8): the input offset of every dim but
//                 `axis` plus the index value times the axis stride; the index is read at its
//                 own strides (0 in the op's broadcast dims).
//   index_select: the output is [outer, count, inner]; each thread moves one word of an inner
//                 block, the widest word (up to 16 bytes) dividing the block, so an embedding
//                 row of 768 f16 moves as 96 16-byte words.
// Indices are i64 or i32; negative ones count from the end, as on the CPU. An index still
// outside [0, dim) cannot throw on the device: the CPU kernel throws kInvalidArgument, while
// this kernel writes zeros for that element (or block). When the index is a constant of the
// graph it is checked here at make time, throwing the CPU's error.
//
// The kernels are codegen/cuh/gather_elements.cuh (gather) and gather_index_select.cuh (a
// template, one extern "C" kernel per word size). why_not_gather decides which nodes they take
// (supports_gather), before anything is generated.
#include <algorithm>
#include <optional>

#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/kernels.h"
#include "src/common/element_access.h"
#include "src/ops/access.h"

namespace kiln::cuda {

namespace gen {
namespace {

// The extern "C" kernel of index_select moving words of w bytes (gather_index_select.cuh).
std::string select_kernel(int w, const char* itype, const std::string& name) {
  const std::string word = word_type(w);
  return "extern \"C\" __global__ void " + name + "(const " + word + "* __restrict__ x, const " + itype +
         "* __restrict__ index, " + word +
         "* __restrict__ y, long long count, long long inner, long long dim, long long n) {\n  kg_index_select<" +
         word + ", " + itype + ">(x, index, y, count, inner, dim, n);\n}\n";
}

// The CPU kernel's error when a constant index is out of range.
std::optional<Error> constant_index_refusal(const Node& n, const Graph& g, int64_t dim, int64_t axis) {
  const Value& iv = g.value(n.inputs[1]);
  if (!iv.is_constant()) return std::nullopt;
  const TensorType& it = iv.type;
  const int64_t count = it.numel();
  if (iv.data->size() < size_t(count) * dtype_size(it.dtype))
    return Error(ErrorCode::kInvalidArgument, detail::concat(op_name(n.op), ": constant index holds too few bytes"));
  for (int64_t k = 0; k < count; ++k) {
    const int64_t raw = static_cast<int64_t>(load_as_double(iv.data->data(), it.dtype, k));
    const int64_t v = raw < 0 ? raw + dim : raw;
    if (v < 0 || v >= dim)
      return Error(ErrorCode::kInvalidArgument,
                   detail::concat(op_name(n.op), " of x ", g.type(n.inputs[0]).to_string(),
                                  (n.name.empty() ? "" : " ('" + n.name + "')"), ": index ", raw,
                                  " is out of range for axis ", axis, " of size ", dim));
  }
  return std::nullopt;
}

// Whether the gather family runs n: nothing when it does, else the error generate_gather fails
// with (op, index dtype, a constant index out of range, gather's rank limit).
std::optional<Error> why_not_gather(const Node& n, const Graph& g) {
  if (n.op != OpKind::kGather && n.op != OpKind::kIndexSelect)
    return Error(ErrorCode::kInternal, detail::concat(op_name(n.op), " is not in the gather family"));
  const TensorType& it = g.type(n.inputs[1]);
  if (it.dtype != DType::kI64 && it.dtype != DType::kI32)
    return Error(ErrorCode::kUnsupported, detail::concat(op_name(n.op), ": index dtype ", dtype_name(it.dtype)));
  const auto axis = size_t(n.attrs.get_int("axis"));
  if (std::optional<Error> e = constant_index_refusal(n, g, g.type(n.inputs[0]).shape()[axis], int64_t(axis))) return e;
  const TensorType& yt = g.type(n.outputs[0]);
  if (yt.numel() == 0) return std::nullopt;
  if (n.op == OpKind::kGather && yt.rank() > kMaxRank)
    return Error(ErrorCode::kUnsupported,
                 detail::concat("gather: rank ", yt.rank(), " exceeds the CUDA kernel's ", kMaxRank));
  return std::nullopt;
}

}  // namespace

Generated generate_gather(const Node& n, const Graph& g) {
  if (std::optional<Error> e = why_not_gather(n, g)) throw *e;
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& it = g.type(n.inputs[1]);
  const char* itype = it.dtype == DType::kI64 ? "long long" : "int";
  const auto x = xt.shape(), y = g.type(n.outputs[0]).shape();
  const auto axis = size_t(n.attrs.get_int("axis"));
  const int64_t dim = x[axis];
  const int64_t numel = g.type(n.outputs[0]).numel();
  const int esz = int(dtype_size(xt.dtype));
  std::vector<int64_t> xs(x.size(), 1);
  for (size_t k = x.size(); k-- > 1;) xs[k - 1] = xs[k] * x[k];
  Generated gn;
  const std::string desc = std::string("cuda ") + op_name(n.op) + " " + dtype_name(it.dtype) + " index";
  gn.plan.describe = desc + " (empty)";
  if (numel == 0) return gn;
  if (n.op == OpKind::kGather) {
    Dims d{};
    const std::vector<int64_t> is = gather_index_strides(n, g);
    for (size_t k = 0; k < y.size(); ++k) d.ext[k] = y[k], d.ist[k] = k == axis ? 0 : xs[k], d.ost[k] = is[k];
    const int R = std::max<int>(1, int(y.size()));
    if (y.empty()) d.ext[0] = 1;
    const bool narrow = std::max({numel, xt.numel(), it.numel()}) < (int64_t(1) << 31);
    gn.source = source_head() + kDimsDecl + "typedef " + word_type(esz) + " W;\ntypedef " + itype + " I;\ntypedef " +
                (narrow ? "unsigned int" : "long long") + " P;\n#define KG_GATHER_RANK " + std::to_string(R) + "\n" +
                std::string(embedded_source("gather_elements.cuh"));
    Launch l("kg_gather", blocks_for(numel, 256), 256);
    l.in(0).in(1).out(0).val(d).i64(xs[axis]).i64(dim).i64(numel);
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe = desc;
    return gn;
  }
  int64_t outer = 1;
  for (size_t k = 0; k < axis; ++k) outer *= x[k];
  const int64_t inner = xs[axis], count = y[axis];
  const int w = word_bytes(esz, {inner * esz});
  gn.source = source_head() + std::string(embedded_source("gather_index_select.cuh"));
  auto select = [&](int wb) {
    const int64_t iw = inner * esz / wb, words = outer * count * iw;
    const std::string name = "kg_index_select_w" + std::to_string(wb);
    gn.source += select_kernel(wb, itype, name);
    Launch l(name, blocks_for(words, 256), 256);
    l.in(0).in(1).out(0).i64(count).i64(iw).i64(dim).i64(words);
    return l;
  };
  Launch l = select(w);
  if (w != esz) with_fallback(l, uint32_t(w), select(esz));
  gn.plan.launches.push_back(std::move(l));
  gn.plan.describe = desc + " (" + std::to_string(w) + "-byte words)";
  return gn;
}

}  // namespace gen

bool supports_gather(const Node& n, const Graph& g, std::string* why) {
  return gen::supported(gen::why_not_gather(n, g), why);
}

std::unique_ptr<Kernel> make_gather_kernel(const Node& n, const Graph& g, const KernelOptions&, const Bytes* state) {
  if (state) return gen::build({}, gen::what_of(n), state);
  return gen::build(gen::generate_gather(n, g), gen::what_of(n), nullptr);
}

}  // namespace kiln::cuda
