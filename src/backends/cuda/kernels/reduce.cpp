// CUDA kernels of the reduce family: reduce_sum / _mean / _max / _min / _var over any axes and
// argmax over one, generated and compiled by NVRTC.
//
// At make time x's dims are collapsed as on the CPU (unit dims dropped, neighbours that are
// both reduced or both kept merged), leaving kept dims and reduced dims around an innermost
// run that is either reduced (rows) or kept (columns):
//   rows:    one warp per output (at most 2048 reduced elements; a single run of at most 16
//            words takes the power of two of lanes that covers it, several outputs per warp)
//            or one 256-thread block, 16-byte loads when every run starts aligned; shuffles
//            combine the lanes (codegen/cuh/reduce_rows.cuh);
//   columns: where every run starts 16-byte aligned, one 16-byte word of consecutive outputs
//            per block, 32 to 256 threads splitting the reduction with up to four words in
//            flight each (reduce_cols_vec.cuh); else 32 consecutive outputs per block, 8 or 32
//            rows of threads splitting the reduction, combined through shared memory
//            (reduce_cols.cuh);
//   few long rows: when plan.h's split_rows splits the outputs of a rows reduction (fewer than
//            two per multiprocessor, each of at least kSplitMinRow elements), each output's
//            elements in chunks of a 256-thread block each, which write their chunk's result
//            (a variance: its mean and squared deviations) to the workspace
//            (reduce_split.cuh), then a block per output combines them (reduce_split_done.cuh).
// The numbers of kept and reduced dims are part of the source (they unroll); extents and
// strides are arguments. Floating sums accumulate in f32 (f64 for f64), integer sums in 64
// bits, wrapping like the CPU; max / min propagate NaN; reduce_var is two-pass (mean, then
// squared deviations), as on the CPU (reduce_common.cuh: the accumulator). argmax keeps the
// first index of the largest value, a NaN counting as largest (reduce_argmax.cuh). An empty
// reduction writes sum 0, mean / var NaN. A sum or mean {square} squares each element as it
// loads it (KG_SQUARE).
#include <cmath>
#include <limits>

#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/codegen/prelude.h"
#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/kernels.h"
#include "src/common/element_access.h"
#include "src/ops/access.h"

namespace kiln::cuda {

namespace gen {
namespace {

constexpr int kMaxSide = 4;  // kept / reduced dims outside the innermost run (Side in reduce_common.cuh)

using Layout = ReduceLayout;

struct Side {
  long long kext[kMaxSide], kst[kMaxSide], rext[kMaxSide], rst[kMaxSide];
};

// Which dims of x (of `rank`) the node reduces: `axes`, or every dim when it is empty.
std::vector<char> reduced_dims(const Node& n, size_t rank) {
  const std::vector<int64_t> axes = n.attrs.get_ints("axes", {});
  std::vector<char> reduced(rank, axes.empty() ? 1 : 0);
  for (int64_t a : axes) reduced[size_t(a)] = 1;
  return reduced;
}

// reduce_common.cuh's parameters (x's compute type, the accumulator's combine, the dims of Side
// in use) and the kernels' mode: 0 the combination, 1 the mean, 2 the variance.
std::string common_defs(OpKind op, DType dt, const Layout& L, int mode, bool square) {
  const bool flt = is_floating(dt);
  const int combine = op == OpKind::kReduceMax ? 1 : op == OpKind::kReduceMin ? 2 : 0;
  return define("KG_COMPUTE", compute_of(dt)) + define("KG_FLOATING", flt) + define("KG_COMBINE", combine) +
         define("KG_INT_SUM", !flt && op == OpKind::kReduceSum) + define("KG_KEPT_DIMS", int64_t(L.kept_shape.size())) +
         define("KG_RED_DIMS", int64_t(L.red_shape.size())) + define("KG_MODE", mode) + define("KG_SQUARE", square);
}

// Elements of `dt` in a 16-byte word when every run of the layout (the innermost one, and each
// kept and reduced stride) starts on a word, so 16-byte loads serve it; else 1.
int word_elements(const Layout& L, DType dt) {
  const size_t esz = dtype_size(dt);
  if (esz > 8) return 1;
  const int64_t vec = int64_t(16 / esz);
  bool ok = L.inner % vec == 0;
  for (int64_t st : L.kept_stride) ok = ok && st % vec == 0;
  for (int64_t st : L.red_stride) ok = ok && st % vec == 0;
  return ok ? int(vec) : 1;
}

Generated gen_argmax(const Node& n, const Graph& g) {
  const TensorType& xt = g.type(n.inputs[0]);
  const auto shape = xt.shape();
  const auto axis = size_t(n.attrs.get_int("axis"));
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < axis; ++d) outer *= shape[d];
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t R = shape[axis];
  Generated gn;
  gn.plan.describe = std::string("cuda argmax ") + xt.to_string() + (inner == 1 ? " (warp per row)" : " (columns)");
  if (outer * inner == 0) return gn;
  gn.source = source_head() + type_defs("x", xt.dtype) + define("KG_COMPUTE", compute_of(xt.dtype)) +
              define("KG_FLOATING", is_floating(xt.dtype)) + std::string(embedded_source("reduce_argmax.cuh"));
  if (inner == 1) {
    Launch l("kg_argmax_rows", blocks_for(outer, 8), 256);
    l.in(0).out(0).i64(outer).i64(R);
    gn.plan.launches.push_back(std::move(l));
  } else {
    Launch l("kg_argmax_cols", blocks_for(outer * inner, 256), 256);
    l.in(0).out(0).i64(outer).i64(R).i64(inner);
    gn.plan.launches.push_back(std::move(l));
  }
  return gn;
}

}  // namespace

std::optional<std::string> why_not_reduce(const Node& n, const Graph& g) {
  const char* op = op_name(n.op);
  if (op_info(n.op).family != OpFamily::kReduce) return detail::concat(op, " is not in the reduce family");
  if (n.inputs.empty() || n.inputs[0] == kNoValue) return detail::concat(op, ": x is absent");
  const TensorType& xt = g.type(n.inputs[0]);
  auto out_of_range = [&](int64_t axis) {
    return detail::concat(op, ": axis ", axis, " out of range for ", xt.to_string());
  };
  if (n.op == OpKind::kArgmax) {
    if (auto why = attr_problem(n, "axis", AttrType::kInt, true)) return why;
    const int64_t axis = n.attrs.get_int("axis");
    if (axis < 0 || axis >= xt.rank()) return out_of_range(axis);
    return std::nullopt;
  }
  if (auto why = attr_problem(n, "axes", AttrType::kInts, false)) return why;
  for (int64_t axis : n.attrs.get_ints("axes", {}))
    if (axis < 0 || axis >= xt.rank()) return out_of_range(axis);
  if (auto why = attr_problem(n, "correction", AttrType::kFloat, false)) return why;
  if (n.op == OpKind::kReduceVar && !is_floating(xt.dtype)) return detail::concat("reduce_var of ", xt.to_string());
  const auto shape = xt.shape();
  const std::vector<char> reduced = reduced_dims(n, shape.size());
  int64_t count = 1;
  for (size_t d = 0; d < shape.size(); ++d) count *= reduced[d] ? shape[d] : 1;
  if (g.type(n.outputs[0]).numel() == 0 || count == 0) return std::nullopt;  // no launch, or a fill
  const Layout L = collapse_reduction(shape, reduced);
  if (L.kept_shape.size() > size_t(kMaxSide) || L.red_shape.size() > size_t(kMaxSide))
    return detail::concat(op, ": more than ", kMaxSide, " alternating reduced and kept dims");
  return std::nullopt;
}

Generated generate_reduce(const Node& n, const Graph& g) { return generate_reduce(n, g, Target{}); }

Generated generate_reduce(const Node& n, const Graph& g, const Target& t) {
  if (const auto why = why_not_reduce(n, g)) KILN_FAIL(kUnsupported, *why);
  if (n.op == OpKind::kArgmax) return gen_argmax(n, g);
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& yt = g.type(n.outputs[0]);
  const DType dt = xt.dtype;
  const auto shape = xt.shape();
  const std::vector<char> reduced = reduced_dims(n, shape.size());
  const double correction = n.attrs.get_float("correction", 1.0);
  const int mode = n.op == OpKind::kReduceMean ? 1 : n.op == OpKind::kReduceVar ? 2 : 0;
  const bool square = n.attrs.get_bool("square", false);

  Generated gn;
  const std::string desc = std::string("cuda ") + op_name(n.op) + (square ? " of squares " : " ") + xt.to_string();
  if (yt.numel() == 0) {
    gn.plan.describe = desc + " (empty)";
    return gn;
  }
  int64_t count = 1;
  for (size_t d = 0; d < shape.size(); ++d) count *= reduced[d] ? shape[d] : 1;
  if (count == 0) {  // sum 0; mean and var NaN
    uint64_t bits = 0;
    store_double(&bits, dt, 0, n.op == OpKind::kReduceSum ? 0.0 : std::numeric_limits<double>::quiet_NaN());
    add_fill(gn.source, gn.plan, 0, yt.numel(), int(dtype_size(dt)), bits);
    gn.plan.describe = desc + " (empty reduction)";
    return gn;
  }
  const Layout L = collapse_reduction(shape, reduced);
  Side side{};
  for (size_t k = 0; k < L.kept_shape.size(); ++k) side.kext[k] = L.kept_shape[k], side.kst[k] = L.kept_stride[k];
  for (size_t k = 0; k < L.red_shape.size(); ++k) side.rext[k] = L.red_shape[k], side.rst[k] = L.red_stride[k];

  gn.source = source_head() + type_defs("x", dt) + common_defs(n.op, dt, L, mode, square) +
              std::string(embedded_source("reduce_common.cuh"));
  // Few long rows, split across blocks (plan.h's split_rows); a chunk's result is one A (f32 for
  // f32 / f16 / bf16, else 8 bytes), two for a variance.
  const int64_t a_bytes = is_floating(dt) && dt != DType::kF64 ? 4 : 8;
  const SplitPlan sp = L.inner_reduced
                           ? split_rows(L.outputs, L.count, word_elements(L, dt), (mode == 2 ? 2 : 1) * a_bytes, t)
                           : SplitPlan{};
  if (sp.split()) {
    const int vec = word_elements(L, dt);
    const uint32_t blocks = blocks_for(L.outputs * sp.splits, 1);
    auto chunks = [&](int v) {
      gn.source += define("KG_V", v) + std::string(embedded_source("reduce_split.cuh"));
      Launch l("kg_reduce_split_v" + std::to_string(v), blocks, kSplitThreads);
      l.in(0).ws().val(side).i64(L.outputs).i64(L.inner).i64(L.count).i64(sp.splits).i64(sp.chunk);
      return l;
    };
    Launch first = chunks(vec);
    if (vec > 1) with_fallback(first, 16, chunks(1));
    gn.source += std::string(embedded_source("reduce_split_done.cuh"));
    Launch done("kg_reduce_split_done", blocks_for(L.outputs, 1), kSplitThreads);
    done.ws().out(0).i64(L.outputs).i64(sp.splits).i64(sp.chunk).i64(L.count).f64(correction);
    gn.plan.launches.push_back(std::move(first));
    gn.plan.launches.push_back(std::move(done));
    gn.plan.workspace = sp.workspace;
    gn.plan.describe = desc + sp.describe("output", vec);
  } else if (L.inner_reduced) {
    const int vec = word_elements(L, dt);
    const bool block = L.count > 2048;
    const int64_t nro = L.count / L.inner;
    // Lanes per output: a warp, or for one short run the lanes that cover its words (row_lanes).
    auto group_of = [&](int v) { return !block && nro == 1 ? row_lanes(L.inner, v) : 32; };
    auto rows = [&](int v) {
      const std::string name = "kg_reduce_rows_v" + std::to_string(v);
      const int lanes = group_of(v);
      gn.source += define("KG_BLOCK", block) + define("KG_GROUP", lanes) + define("KG_V", v) +
                   std::string(embedded_source("reduce_rows.cuh"));
      const int64_t warps = (L.outputs + 32 / lanes - 1) / (32 / lanes);
      Launch l(name, block ? blocks_for(L.outputs, 1) : blocks_for(warps, 8), 256);
      l.in(0).out(0).val(side).i64(L.outputs).i64(nro).i64(L.inner).i64(L.count).f64(correction);
      return l;
    };
    Launch l = rows(vec);
    if (vec > 1) with_fallback(l, 16, rows(1));
    gn.plan.launches.push_back(std::move(l));
    const int lanes = group_of(vec);
    const std::string who = block ? "block" : lanes_name(lanes);
    gn.plan.describe = desc + " (" + who + " per output, " + std::to_string(vec) + "-wide loads)";
  } else {
    gn.source += std::string(embedded_source("reduce_cols.cuh"));
    const int64_t rows = L.outputs / L.inner, tiles = (L.inner + 31) / 32;
    // Few column tiles (a global average pool at batch 1: [1, 784, 72] is 3 tiles) leave most of
    // the GPU idle; 32 ways instead of 8 then shorten each thread's serial run over the rows.
    const uint32_t ways = rows * tiles < kLargeGpuSms ? 32 : 8;
    Launch l("kg_reduce_cols", blocks_for(rows * tiles, 1), 32, 1, ways);
    l.in(0).out(0).val(side).i64(rows).i64(L.inner).i64(L.count).f64(correction);
    if (const int vec = word_elements(L, dt); vec > 1) {  // the scalar kernel as the fallback for unaligned x
      const std::string name = "kg_reduce_cols_v" + std::to_string(vec);
      gn.source += define("KG_V", vec) + std::string(embedded_source("reduce_cols_vec.cuh"));
      uint32_t threads = 32;  // about four rows per thread
      while (threads < 256 && int64_t(threads) * 4 < L.count) threads *= 2;
      Launch v(name, blocks_for(rows * (L.inner / vec), 1), threads);
      v.in(0).out(0).val(side).i64(rows).i64(L.inner).i64(L.count).f64(correction);
      with_fallback(v, 16, std::move(l));
      gn.plan.launches.push_back(std::move(v));
      gn.plan.describe = desc + " (columns, " + std::to_string(vec) + "-wide loads)";
    } else {
      gn.plan.launches.push_back(std::move(l));
      gn.plan.describe = desc + " (columns)";
    }
  }
  return gn;
}

}  // namespace gen

bool supports_reduce(const Node& n, const Graph& g, std::string* why) {
  return gen::supported(gen::why_not_reduce(n, g), why);
}

std::unique_ptr<Kernel> make_reduce_kernel(const Node& n, const Graph& g, const KernelOptions& options,
                                           const Bytes* state) {
  if (state) return gen::build({}, gen::what_of(n), state);
  const gen::Target t{current_device().sm_count, options.workspace_limit};
  return gen::build(gen::generate_reduce(n, g, t), gen::what_of(n), nullptr);
}

}  // namespace kiln::cuda
