// Nodes in a layout attribute's other form on the CPU: conv, max_pool and avg_pool with layout
// "nhwc" (made by the to_channels_last pass for GPU builds) run as the same op's default-layout
// kernel between permutes of the moved inputs and the output into and out of the workspace.
// Every permute here swaps two adjacent blocks of dims (e.g. [N, H, W, C] <-> [N, C, H, W]), a
// batched 2-D transpose of contiguous elements. The CPU keeps one implementation per op; the
// copies make these nodes slower here than their default form, which is what a CPU build uses.
// (sdpa's layout "bshd" and operand views gather through their own strided copies instead:
// src/backends/cpu/attention.cpp.)
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
  size_t elem = 0;                        // bytes per transposed element (the dims after the blocks)
  size_t offset = 0;                      // in the workspace
};

// The transpose that applies `perm` (result dim i = dim perm[i]) to `shape`: perm must keep a
// prefix and a suffix and swap the two blocks of dims between them.
Moved block_swap(const std::vector<int64_t>& shape, const std::vector<int64_t>& perm, size_t es, const char* what) {
  const size_t r = perm.size();
  KILN_CHECK(shape.size() == r, kInternal, what, ": permute of rank ", r, " on a rank-", shape.size(), " tensor");
  size_t a = 0;
  while (a < r && perm[a] == int64_t(a)) ++a;
  Moved m;
  m.batch = 1, m.rows = 1, m.cols = 1, m.elem = es;
  if (a == r) return m;  // identity: a copy
  const size_t b = size_t(perm[a]);
  size_t i = a, c = b;
  while (i < r && perm[i] == int64_t(c)) ++i, ++c;  // block [b, c) first
  for (size_t d = a; d < b; ++d, ++i)
    KILN_CHECK(i < r && perm[i] == int64_t(d), kInternal, what, ": permute ", list_str(perm), " is not a block swap");
  for (size_t d = c; d < r; ++d, ++i)
    KILN_CHECK(i < r && perm[i] == int64_t(d), kInternal, what, ": permute ", list_str(perm), " is not a block swap");
  for (size_t d = 0; d < a; ++d) m.batch *= shape[d];
  for (size_t d = a; d < b; ++d) m.rows *= shape[d];
  for (size_t d = b; d < c; ++d) m.cols *= shape[d];
  for (size_t d = c; d < r; ++d) m.elem *= size_t(shape[d]);
  return m;
}

TensorType permuted(const TensorType& t, const std::vector<int64_t>& perm) {
  TensorType p = t;
  for (size_t i = 0; i < perm.size(); ++i) p.dims[i] = t.dims[size_t(perm[i])];
  return p;
}

}  // namespace

std::unique_ptr<Kernel> make_relayout(const Node& n, const Graph& g, const std::vector<size_t>& moved_inputs,
                                      const std::vector<int64_t>& perm, const KernelMaker& make_inner) {
  std::vector<int64_t> inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[size_t(perm[i])] = int64_t(i);
  // The same node in its default layout, in a graph of its own.
  auto inner = std::make_shared<Graph>();
  auto is_moved = [&](size_t i) {
    return std::find(moved_inputs.begin(), moved_inputs.end(), i) != moved_inputs.end() && n.inputs[i] != kNoValue;
  };
  std::vector<ValueId> ins;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const ValueId v = n.inputs[i];
    ins.push_back(v == kNoValue ? kNoValue
                                : inner->add_input("in" + std::to_string(i),
                                                   is_moved(i) ? permuted(g.type(v), perm) : g.type(v)));
  }
  Attrs attrs = n.attrs;
  attrs.erase("layout");
  const ValueId y_inner = inner->add_node(n.op, ins, attrs, n.name)[0];
  std::shared_ptr<const Kernel> first = make_inner(*inner->nodes().back(), *inner);
  const std::string what = std::string(op_name(n.op)) + " (layout " + n.attrs.get_string("layout", "") + ")";
  KILN_CHECK(permuted(inner->type(y_inner), inverse).shape() == g.type(n.outputs[0]).shape(), kInternal, what,
             ": the default-layout output ", inner->type(y_inner).to_string(), " does not permute to ",
             g.type(n.outputs[0]).to_string());

  size_t used = 0;
  auto carve = [&](const TensorType& t) {
    const size_t at = used;
    used += (t.nbytes() + 63) / 64 * 64;
    return at;
  };
  std::vector<Moved> moved(n.inputs.size());
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (!is_moved(i)) continue;
    const TensorType& t = g.type(n.inputs[i]);
    moved[i] = block_swap(t.shape(), perm, dtype_size(t.dtype), what.c_str());
    moved[i].offset = carve(t);
  }
  const TensorType& y = inner->type(y_inner);
  Moved out = block_swap(y.shape(), inverse, dtype_size(y.dtype), what.c_str());
  out.offset = carve(y);
  const size_t inner_at = used, ws = used + first->workspace_size();

  auto fn = [=](const void* const* in, void* const* outs, const RunContext& ctx) {
    (void)inner;  // keeps the graph the default-layout kernel was made from
    check_workspace(ctx, ws, what.c_str());
    char* base = static_cast<char*>(ctx.workspace);
    std::vector<const void*> args(in, in + moved.size());
    for (size_t i = 0; i < moved.size(); ++i) {
      if (moved[i].batch == 0) continue;
      transpose_batched(in[i], base + moved[i].offset, moved[i].batch, moved[i].rows, moved[i].cols, moved[i].elem);
      args[i] = base + moved[i].offset;
    }
    void* y_first = base + out.offset;
    RunContext inner_ctx = ctx;
    inner_ctx.workspace = base + inner_at;
    inner_ctx.workspace_size = ws - inner_at;
    first->run(args.data(), &y_first, inner_ctx);
    transpose_batched(y_first, outs[0], out.batch, out.rows, out.cols, out.elem);
  };
  return make_fn_kernel(fn, first->describe() + " (" + what + " through permuted copies)", ws);
}

std::unique_ptr<Kernel> make_channels_last(const Node& n, const Graph& g, const std::vector<size_t>& moved_inputs,
                                           const KernelMaker& make_first) {
  for (size_t i : moved_inputs)
    if (i < n.inputs.size() && n.inputs[i] != kNoValue) (void)channels_first_view(g.type(n.inputs[i]));  // rank 4
  return make_relayout(n, g, moved_inputs, {0, 3, 1, 2}, make_first);
}

}  // namespace kiln::cpu
