// CUDA kernels of softmax and log_softmax over one axis, generated and compiled by NVRTC.
//
// x is viewed as [outer, R, inner] around the axis. Statistics are f32 (f64 for f64):
//   inner == 1, R <= 1024:   one warp per row; the row lives in registers (each lane holds up
//                            to 32 elements), loaded with vectors of up to 16 bytes when R
//                            allows; max, then exp and sum, then the scaled write: x is read
//                            once (codegen/cuh/softmax_rows.cuh).
//   inner == 1, R <= 16384:  one 512-thread block per row, the row again in registers.
//   inner == 1, longer:      one block per row in two passes over memory: an online (max, sum)
//                            pass, then the write pass (softmax_long.cuh);
//                            when plan.h's split_rows splits the rows (fewer than two per
//                            multiprocessor), each row in chunks of a 256-thread block each:
//                            a first kernel writes each chunk's (max, sum) to the workspace, a
//                            second combines the row's chunks and writes its chunk, with
//                            vectors of up to 16 bytes (softmax_split.cuh).
//   inner > 1:               one thread per column, three passes (max, sum, write), coalesced
//                            along the kept run (softmax_cols.cuh).
// Semantics follow the CPU: softmax = exp(x - max) * (1 / sum), log_softmax =
// (x - max) - log(sum); a NaN anywhere makes the row NaN.
#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/codegen/prelude.h"
#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/kernels.h"

namespace kiln::cuda {

namespace gen {
namespace {

constexpr int kBlockThreads = 512;

// The register-cached row kernel kg_softmax_rows_v<vec>: G threads per row (32: a warp, else
// the block), EPL elements per thread in chunks of vec.
std::string rows_kernel(bool log, bool warp, int epl, int vec, int esz) {
  return define("KG_LOG", log) + define("KG_WARP", warp) + define("KG_EPL", epl) + define("KG_V", vec) +
         define("KG_VW", word_type(vec * esz)) + std::string(embedded_source("softmax_rows.cuh"));
}

// The split kernels kg_softmax_split_stats_v<vec> and kg_softmax_split_apply_v<vec>.
std::string split_kernels(bool log, int vec, int esz) {
  return define("KG_LOG", log) + define("KG_V", vec) + define("KG_VW", word_type(vec * esz)) +
         std::string(embedded_source("softmax_split.cuh"));
}

}  // namespace

std::optional<std::string> why_not_softmax(const Node& n, const Graph& g) {
  const char* op = op_name(n.op);
  if (n.op != OpKind::kSoftmax && n.op != OpKind::kLogSoftmax)
    return detail::concat(op, " is not in the softmax family");
  if (n.inputs.empty() || n.inputs[0] == kNoValue) return detail::concat(op, ": x is absent");
  const TensorType& xt = g.type(n.inputs[0]);
  if (!is_floating(xt.dtype)) return detail::concat(op, ": x must be floating, got ", xt.to_string());
  if (auto why = attr_problem(n, "axis", AttrType::kInt, true)) return why;
  const int64_t axis = n.attrs.get_int("axis");
  if (axis < 0 || axis >= xt.rank()) return detail::concat(op, ": axis ", axis, " out of range for ", xt.to_string());
  return std::nullopt;
}

Generated generate_softmax(const Node& n, const Graph& g) { return generate_softmax(n, g, Target{}); }

Generated generate_softmax(const Node& n, const Graph& g, const Target& t) {
  if (const auto why = why_not_softmax(n, g)) KILN_FAIL(kUnsupported, *why);
  const TensorType& xt = g.type(n.inputs[0]);
  const auto shape = xt.shape();
  const auto axis = size_t(n.attrs.get_int("axis"));
  int64_t outer = 1, inner = 1;
  const int64_t R = shape.at(axis);
  for (size_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const bool log = n.op == OpKind::kLogSoftmax;
  Generated gn;
  const std::string desc = std::string("cuda ") + op_name(n.op) + " " + xt.to_string();
  gn.plan.describe = desc + " (empty)";
  if (outer * R * inner == 0) return gn;
  gn.source = source_head() + type_defs("x", xt.dtype) + "typedef " + compute_of(xt.dtype) + " A;\n";
  const int esz = int(dtype_size(xt.dtype));
  // Rows longer than the register kernels hold, split across blocks when they are few (plan.h's
  // split_rows); each chunk's (max, sum) in A.
  const int split_vec = split_row(R, 1, esz).vec;
  const SplitPlan sp =
      inner == 1 ? split_rows(outer, R, split_vec, 2 * (xt.dtype == DType::kF64 ? 8 : 4), t) : SplitPlan{};
  if (inner == 1 && R <= 16 * kBlockThreads) {
    const bool warp = R <= 1024;
    const int G = warp ? 32 : kBlockThreads;
    const RowSplit split = split_row(R, G, esz);
    const int epl = split.per_lane, vec = split.vec;
    auto rows = [&](int v) {
      const std::string name = "kg_softmax_rows_v" + std::to_string(v);
      gn.source += rows_kernel(log, warp, epl, v, esz);
      Launch l(name, warp ? blocks_for(outer, 4) : blocks_for(outer, 1), warp ? 128 : uint32_t(G));
      l.in(0).out(0).i64(outer).i64(R);
      return l;
    };
    Launch l = rows(vec);
    if (vec > 1) with_fallback(l, uint32_t(vec * esz), rows(1));
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe =
        desc + (warp ? " (warp" : " (block") + " per row in registers, " + std::to_string(vec) + "-wide loads)";
  } else if (sp.split()) {
    const int vec = split_vec;
    const uint32_t blocks = blocks_for(outer * sp.splits, 1);
    auto stats = [&](int v) {
      gn.source += split_kernels(log, v, esz);
      Launch l("kg_softmax_split_stats_v" + std::to_string(v), blocks, kSplitThreads);
      l.in(0).ws().i64(outer).i64(R).i64(sp.splits).i64(sp.chunk);
      return l;
    };
    auto apply = [&](int v) {
      Launch l("kg_softmax_split_apply_v" + std::to_string(v), blocks, kSplitThreads);
      l.in(0).ws().out(0).i64(outer).i64(R).i64(sp.splits).i64(sp.chunk);
      return l;
    };
    Launch first = stats(vec), second = apply(vec);
    if (vec > 1) {
      with_fallback(first, uint32_t(vec * esz), stats(1));
      with_fallback(second, uint32_t(vec * esz), apply(1));
    }
    gn.plan.launches.push_back(std::move(first));
    gn.plan.launches.push_back(std::move(second));
    gn.plan.workspace = sp.workspace;
    gn.plan.describe = desc + sp.describe("row", vec);
  } else if (inner == 1) {
    gn.source += define("KG_LOG", log) + std::string(embedded_source("softmax_long.cuh"));
    Launch l("kg_softmax_long", blocks_for(outer, 1), 1024);
    l.in(0).out(0).i64(outer).i64(R);
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe = desc + " (block per row, two passes)";
  } else {
    gn.source += define("KG_LOG", log) + std::string(embedded_source("softmax_cols.cuh"));
    Launch l("kg_softmax_cols", blocks_for(outer * inner, 256), 256);
    l.in(0).out(0).i64(outer).i64(R).i64(inner);
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe = desc + " (thread per column)";
  }
  return gn;
}

}  // namespace gen

bool supports_softmax(const Node& n, const Graph& g, std::string* why) {
  return gen::supported(gen::why_not_softmax(n, g), why);
}

std::unique_ptr<Kernel> make_softmax_kernel(const Node& n, const Graph& g, const KernelOptions& options,
                                            const Bytes* state) {
  if (state) return gen::build({}, gen::what_of(n), state);
  const gen::Target t{current_device().sm_count, options.workspace_limit};
  return gen::build(gen::generate_softmax(n, g, t), gen::what_of(n), nullptr);
}

}  // namespace kiln::cuda
