// CUDA kernels of the pool family (NCHW, or NHWC for max_pool / avg_pool with layout "nhwc";
// 1-D pools run as 2-D with a unit height), generated and compiled by NVRTC. Values compute in
// f32 (f64 for f64).
//
//   max_pool / avg_pool: one thread per output element, walking its window tap by tap in the
//     CPU's order (kernel row, then column), skipping taps in the padding (max_pool's -inf,
//     avg_pool's zeros). avg_pool's divisor is PyTorch's: the window clipped to input +
//     padding (count_include_pad) or to the input, or the divisor override; a window lying
//     wholly in the padding (ceil_mode) gives 0, as on the CPU. max_pool propagates NaN.
//     (codegen/cuh/pool_max.cuh, pool_avg.cuh; channels-last max_pool over the engine's own
//     buffers moves 16 bytes of channels per thread: pool_max_nhwc.cuh.)
//   adaptive_avg_pool: one thread per output over PyTorch's window [floor(o * in / out),
//     ceil((o + 1) * in / out)); the global case (1 x 1 output, e.g. before a classifier) is a
//     warp per plane with a shuffle reduction (pool_adaptive.cuh).
#include <algorithm>

#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/codegen/prelude.h"
#include "src/backends/cuda/kernels.h"
#include "src/ops/access.h"

namespace kiln::cuda {

namespace gen {
namespace {

using Geom = PoolGeometry;
static_assert(sizeof(Geom) == 14 * sizeof(long long), "kernels take Geom by value as 14 long longs (pool_geom.cuh)");

// Whether v lives in the engine's arena (not a caller's buffer): its address is aligned.
bool arena_value(const Graph& g, ValueId v) {
  return g.value(v).producer != nullptr && std::find(g.outputs().begin(), g.outputs().end(), v) == g.outputs().end();
}

// A list attribute whose last value (and first, for 2-D pools) pool_geometry reads.
std::optional<std::string> window_attr(const Node& n, const char* key, bool required) {
  if (auto why = attr_problem(n, key, AttrType::kInts, required)) return why;
  if (n.attrs.has(key) && n.attrs.get_ints(key).empty())
    return detail::concat(op_name(n.op), ": attribute '", key, "' must not be empty");
  return std::nullopt;
}

}  // namespace

std::optional<std::string> why_not_pool(const Node& n, const Graph& g) {
  const char* op = op_name(n.op);
  if (n.op != OpKind::kMaxPool && n.op != OpKind::kAvgPool && n.op != OpKind::kAdaptiveAvgPool)
    return detail::concat(op, " is not in the pool family");
  if (n.inputs.empty() || n.inputs[0] == kNoValue) return detail::concat(op, ": x is absent");
  const TensorType& xt = g.type(n.inputs[0]);
  if (!is_floating(xt.dtype)) return detail::concat(op, ": x must be floating, got ", xt.to_string());
  if (xt.rank() != 3 && xt.rank() != 4) return detail::concat(op, ": x must be [N, C, W] or [N, C, H, W]");
  if (n.attrs.has("layout")) {
    const auto* layout = std::get_if<std::string>(&n.attrs.items().at("layout"));
    if (!layout) return detail::concat(op, ": attribute 'layout' must be a string");
    if (*layout != "nchw" && *layout != "nhwc")
      return detail::concat(op, ": attribute 'layout' must be \"nchw\" or \"nhwc\", got \"", *layout, "\"");
    if (*layout == "nhwc") {
      const TensorType& yt = g.type(n.outputs[0]);
      if (n.op == OpKind::kAdaptiveAvgPool)
        return detail::concat(op, ": layout \"nhwc\" applies to max_pool and avg_pool");
      if (xt.rank() != 4 || yt.rank() != 4)
        return detail::concat(op, ": layout \"nhwc\" takes x and y [N, H, W, C], got ", xt.to_string(), " and ",
                              yt.to_string());
    }
  }
  if (n.op == OpKind::kAdaptiveAvgPool) return std::nullopt;
  if (auto why = window_attr(n, "kernel", true)) return why;
  if (auto why = attr_problem(n, "stride", AttrType::kInts, false)) return why;  // empty: the kernel
  if (auto why = window_attr(n, "padding", false)) return why;
  if (auto why = window_attr(n, "dilation", false)) return why;
  if (n.op != OpKind::kAvgPool || g.type(n.outputs[0]).numel() == 0) return std::nullopt;
  if (auto why = attr_problem(n, "count_include_pad", AttrType::kBool, false)) return why;
  return attr_problem(n, "divisor", AttrType::kInt, false);
}

Generated generate_pool(const Node& n, const Graph& g) {
  if (const auto why = why_not_pool(n, g)) KILN_FAIL(kUnsupported, *why);
  const TensorType& xt = g.type(n.inputs[0]);
  const Geom q = pool_geometry(n, g);
  const int64_t total = g.type(n.outputs[0]).numel();
  Generated gn;
  const std::string desc = std::string("cuda ") + op_name(n.op) + " " + xt.to_string();
  gn.plan.describe = desc + " (empty)";
  if (total == 0) return gn;
  const std::string head = source_head() + std::string(embedded_source("pool_geom.cuh")) + type_defs("x", xt.dtype) +
                           "typedef " + compute_of(xt.dtype) + " A;\n";
  const int vec = q.C ? int(16 / dtype_size(xt.dtype)) : 0;
  if (n.op == OpKind::kMaxPool && vec > 1 && q.C % vec == 0 && total / vec < (int64_t(1) << 31) &&
      g.type(n.inputs[0]).numel() < (int64_t(1) << 31) && arena_value(g, n.inputs[0]) && arena_value(g, n.outputs[0])) {
    gn.source = head + define("KG_V", vec) + std::string(embedded_source("pool_max_nhwc.cuh"));
    Launch l("kg_max_pool_nhwc", blocks_for(total / vec, 256), 256);
    l.in(0).out(0).val(q).val(int(total / vec));
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe = desc + " (nhwc, " + std::to_string(vec) + " channels per thread)";
  } else if (n.op == OpKind::kMaxPool) {
    gn.source = head + std::string(embedded_source("pool_max.cuh"));
    Launch l("kg_max_pool", blocks_for(total, 256), 256);
    l.in(0).out(0).val(q).i64(total);
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe = desc + " (thread per output)";
  } else if (n.op == OpKind::kAvgPool) {
    gn.source = head + std::string(embedded_source("pool_avg.cuh"));
    Launch l("kg_avg_pool", blocks_for(total, 256), 256);
    l.in(0)
        .out(0)
        .val(q)
        .i64(total)
        .i64(n.attrs.get_bool("count_include_pad", true) ? 1 : 0)
        .i64(n.attrs.get_int("divisor", 0));
    gn.plan.launches.push_back(std::move(l));
    gn.plan.describe = desc + " (thread per output)";
  } else {  // adaptive_avg_pool
    gn.source = head + std::string(embedded_source("pool_adaptive.cuh"));
    if (q.OH == 1 && q.OW == 1) {
      Launch l("kg_global_pool", blocks_for(q.planes, 8), 256);
      l.in(0).out(0).i64(q.planes).i64(q.H * q.W);
      gn.plan.launches.push_back(std::move(l));
      gn.plan.describe = desc + " (global: warp per plane)";
    } else {
      Launch l("kg_adaptive_pool", blocks_for(total, 256), 256);
      l.in(0).out(0).val(q).i64(total);
      gn.plan.launches.push_back(std::move(l));
      gn.plan.describe = desc + " (thread per output)";
    }
  }
  return gn;
}

}  // namespace gen

bool supports_pool(const Node& n, const Graph& g, std::string* why) {
  return gen::supported(gen::why_not_pool(n, g), why);
}

std::unique_ptr<Kernel> make_pool_kernel(const Node& n, const Graph& g, const KernelOptions&, const Bytes* state) {
  if (state) return gen::build({}, gen::what_of(n), state);
  return gen::build(gen::generate_pool(n, g), gen::what_of(n), nullptr);
}

}  // namespace kiln::cuda
