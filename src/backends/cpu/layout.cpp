// Channels-last nodes on the CPU: conv, max_pool and avg_pool with layout "nhwc" (made by the
// to_channels_last pass for GPU builds) run as the family's channels-first kernel between
// transposes of their 4-D inputs and output into and out of the workspace. The CPU keeps one
// implementation per op; the copies make these nodes slower here than their channels-first
// form, which is what a CPU build uses.
#include <cstring>

#include "src/backends/cpu/gemm.h"
#include "src/backends/cpu/kernels.h"
#include "src/ops/shape_rules.h"

namespace kiln::cpu {

namespace {

// dst[b][j][i] = src[b][i][j] for [batch, rows, cols] of `es`-byte elements.
void transpose_batched(const void* src, void* dst, int64_t batch, int64_t rows, int64_t cols, size_t es) {
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  parallel_for(batch * cols, std::max<int64_t>(1, 4096 / std::max<int64_t>(rows, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t bj = lo; bj < hi; ++bj) {
      const int64_t b = bj / cols, j = bj % cols;
      const char* from = s + size_t(b * rows * cols + j) * es;
      char* to = d + size_t(bj * rows) * es;
      for (int64_t i = 0; i < rows; ++i) std::memcpy(to + size_t(i) * es, from + size_t(i * cols) * es, es);
    }
  });
}

struct Moved {
  int64_t batch = 0, rows = 0, cols = 0;  // [batch, rows, cols] -> [batch, cols, rows]; batch 0: not moved
  size_t offset = 0;                      // in the workspace
};

}  // namespace

std::unique_ptr<Kernel> make_channels_last(const Node& n, const Graph& g, const std::vector<size_t>& moved_inputs,
                                           std::unique_ptr<Kernel> (*make_first)(const Node&, const Graph&)) {
  // The same node over channels-first types, in a graph of its own.
  auto inner = std::make_shared<Graph>();
  auto is_moved = [&](size_t i) {
    return std::find(moved_inputs.begin(), moved_inputs.end(), i) != moved_inputs.end() && n.inputs[i] != kNoValue;
  };
  std::vector<ValueId> ins;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const ValueId v = n.inputs[i];
    ins.push_back(v == kNoValue ? kNoValue
                                : inner->add_input("in" + std::to_string(i),
                                                   is_moved(i) ? channels_first_view(g.type(v)) : g.type(v)));
  }
  Attrs attrs = n.attrs;
  attrs.erase("layout");
  inner->add_node(n.op, ins, attrs, n.name);
  std::shared_ptr<const Kernel> first = make_first(*inner->nodes().back(), *inner);

  size_t used = 0;
  auto carve = [&](const TensorType& t) {
    const size_t at = used;
    used += (t.nbytes() + 63) / 64 * 64;
    return at;
  };
  std::vector<Moved> moved(n.inputs.size());
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (!is_moved(i)) continue;
    const TensorType& t = g.type(n.inputs[i]);  // [N, H, W, C] -> [N, C, H*W]
    moved[i] = Moved{t.dims[0].extent, t.dims[1].extent * t.dims[2].extent, t.dims[3].extent, carve(t)};
  }
  const TensorType& y = g.type(n.outputs[0]);  // computed as [N, C, OH*OW] -> [N, OH, OW, C]
  const Moved out{y.dims[0].extent, y.dims[3].extent, y.dims[1].extent * y.dims[2].extent, carve(y)};
  const size_t es = dtype_size(y.dtype), inner_at = used, ws = used + first->workspace_size();
  const std::string what = std::string(op_name(n.op)) + " (nhwc)";

  auto fn = [=](const void* const* in, void* const* outs, const RunContext& ctx) {
    (void)inner;  // keeps the graph the channels-first kernel was made from
    check_workspace(ctx, ws, what.c_str());
    char* base = static_cast<char*>(ctx.workspace);
    std::vector<const void*> args(in, in + moved.size());
    for (size_t i = 0; i < moved.size(); ++i) {
      if (moved[i].batch == 0) continue;
      transpose_batched(in[i], base + moved[i].offset, moved[i].batch, moved[i].rows, moved[i].cols, es);
      args[i] = base + moved[i].offset;
    }
    void* y_first = base + out.offset;
    RunContext inner_ctx = ctx;
    inner_ctx.workspace = base + inner_at;
    inner_ctx.workspace_size = ws - inner_at;
    first->run(args.data(), &y_first, inner_ctx);
    transpose_batched(y_first, outs[0], out.batch, out.rows, out.cols, es);
  };
  return make_fn_kernel(fn, first->describe() + " (nhwc through nchw copies)", ws);
}

}  // namespace kiln::cpu
