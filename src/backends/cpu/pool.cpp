// CPU kernels of the pool family (NCHW; 1-D pools run as 2-D with a unit height), parallel
// over (n, c) planes.
//
// max_pool and avg_pool walk each output row tap by tap: for one kernel tap the in-bounds
// outputs form a contiguous range (tap_range), so the inner loop is a plain vectorizable
// max/add over a row; padding is skipped, which is max_pool's -inf and avg_pool's zeros.
// avg_pool divisors follow PyTorch: the window clipped to input + padding
// (count_include_pad) or to the input, or the divisor override; windows lying wholly in the
// padding (ceil_mode) give 0. The divisor is separable, so its row and column factors are
// precomputed. adaptive_avg_pool sums rows of a window first (vectorized) and then columns.
// max_pool propagates NaN, as PyTorch does. A channels-last pool (layout "nhwc") runs through
// channels-first copies (layout.cpp).
#include <cmath>
#include <limits>

#include "src/backends/cpu/gemm.h"
#include "src/ops/access.h"
#include "src/ops/shape_rules.h"

namespace kiln::cpu {

namespace {

using Geom = PoolGeometry;

// One output row: fold every in-bounds tap of every kernel row into orow with op.
template <typename Op>
void pool_row(const Geom& q, const float* plane, int64_t oh, float* orow, Op op) {
  for (int64_t ki = 0; ki < q.KH; ++ki) {
    const int64_t ih = oh * q.sh - q.ph + ki * q.dh;
    if (ih < 0 || ih >= q.H) continue;
    const float* irow = plane + ih * q.W;
    for (int64_t kj = 0; kj < q.KW; ++kj) {
      const int64_t off = kj * q.dw - q.pw;
      int64_t lo, hi;
      tap_range(q.OW, q.W, q.sw, off, lo, hi);
      if (q.sw == 1) {
        for (int64_t ow = lo; ow < hi; ++ow) orow[ow] = op(orow[ow], irow[ow + off]);
      } else {
        for (int64_t ow = lo; ow < hi; ++ow) orow[ow] = op(orow[ow], irow[ow * q.sw + off]);
      }
    }
  }
}

int64_t plane_grain(const Geom& q) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, q.H * q.W)); }

void max_pool(const Geom& q, const float* x, float* y) {
  parallel_for(q.planes, plane_grain(q), [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p)
      for (int64_t oh = 0; oh < q.OH; ++oh) {
        float* orow = y + (p * q.OH + oh) * q.OW;
        std::fill(orow, orow + q.OW, -std::numeric_limits<float>::infinity());
        pool_row(q, x + p * q.H * q.W, oh, orow, [](float m, float v) { return (v > m || v != v) ? v : m; });
      }
  });
}

// Divisor factors along one dim: window size clipped to input + padding, or to the input.
std::vector<float> avg_factors(int64_t out, int64_t in, int64_t k, int64_t s, int64_t pad, bool include_pad) {
  std::vector<float> f(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    int64_t start = o * s - pad, end = std::min(start + k, in + pad);
    int64_t padded = end - start;
    int64_t clipped = std::min(end, in) - std::max<int64_t>(start, 0);
    f[size_t(o)] = clipped <= 0 ? 0.0f : static_cast<float>(include_pad ? padded : clipped);
  }
  return f;
}

std::unique_ptr<Kernel> make(const Node& n, const Graph& g, std::function<void(const float*, float*, float*)> run,
                             int64_t row_scratch, std::string desc) {
  const DType dt = g.type(n.inputs[0]).dtype;
  const int64_t xn = g.type(n.inputs[0]).numel(), yn = g.type(n.outputs[0]).numel();
  const bool convert = dt != DType::kF32;
  Carver sizes;
  sizes.take(convert ? xn : 0);
  sizes.take(convert ? yn : 0);
  sizes.take(row_scratch);
  const size_t ws = sizes.used();
  const char* name = op_name(n.op);
  auto fn = [=](const void* const* in, void* const* out, const RunContext& ctx) {
    check_workspace(ctx, ws, name);
    Carver c(ctx.workspace);
    float* xs = c.take(convert ? xn : 0);
    float* ys = c.take(convert ? yn : 0);
    float* rows = c.take(row_scratch);
    if (convert) to_f32_parallel(in[0], dt, xs, xn);
    run(convert ? xs : static_cast<const float*>(in[0]), convert ? ys : static_cast<float*>(out[0]), rows);
    if (convert) from_f32_parallel(ys, dt, out[0], yn);
  };
  return make_fn_kernel(fn, std::move(desc), ws);
}

}  // namespace

std::unique_ptr<Kernel> make_pool_kernel(const Node& n, const Graph& g) {
  if (channels_last(n.op, n.attrs)) return make_channels_last(n, g, {0}, &make_pool_kernel);
  const Geom q = pool_geometry(n, g);
  if (n.op == OpKind::kMaxPool)
    return make(n, g, [q](const float* x, float* y, float*) { max_pool(q, x, y); }, 0, "cpu max_pool rows");

  if (n.op == OpKind::kAvgPool) {
    const bool include_pad = n.attrs.get_bool("count_include_pad", true);
    const int64_t divisor = n.attrs.get_int("divisor", 0);
    auto fh = std::make_shared<const std::vector<float>>(avg_factors(q.OH, q.H, q.KH, q.sh, q.ph, include_pad));
    auto fw = std::make_shared<const std::vector<float>>(avg_factors(q.OW, q.W, q.KW, q.sw, q.pw, include_pad));
    auto run = [q, fh, fw, divisor](const float* x, float* y, float*) {
      parallel_for(q.planes, plane_grain(q), [&](int64_t b, int64_t e) {
        for (int64_t p = b; p < e; ++p)
          for (int64_t oh = 0; oh < q.OH; ++oh) {
            float* orow = y + (p * q.OH + oh) * q.OW;
            std::fill(orow, orow + q.OW, 0.0f);
            pool_row(q, x + p * q.H * q.W, oh, orow, [](float s, float v) { return s + v; });
            const float rh = (*fh)[size_t(oh)];
            for (int64_t ow = 0; ow < q.OW; ++ow) {
              const float f = rh * (*fw)[size_t(ow)];  // 0: the window is all padding
              orow[ow] = f == 0.0f ? 0.0f : orow[ow] / (divisor ? static_cast<float>(divisor) : f);
            }
          }
      });
    };
    return make(n, g, run, 0, "cpu avg_pool rows");
  }

  KILN_CHECK(n.op == OpKind::kAdaptiveAvgPool, kInternal, op_name(n.op), " is not in the pool family");
  // PyTorch's adaptive windows: [floor(o * in / out), ceil((o + 1) * in / out)).
  auto windows = [](int64_t out, int64_t in) {
    std::vector<int64_t> w(size_t(2 * out));
    for (int64_t o = 0; o < out; ++o) w[size_t(2 * o)] = o * in / out, w[size_t(2 * o + 1)] = ((o + 1) * in + out - 1) / out;
    return std::make_shared<const std::vector<int64_t>>(std::move(w));
  };
  if (q.OH == 1 && q.OW == 1) {  // global average pool: one contiguous sum per plane
    auto run = [q](const float* x, float* y, float*) {
      const int64_t hw = q.H * q.W;
      parallel_for(q.planes, plane_grain(q), [&](int64_t b, int64_t e) {
        for (int64_t p = b; p < e; ++p) {
          const float* src = x + p * hw;
          float lanes[16] = {};  // independent partial sums, so the loop vectorizes
          int64_t i = 0;
          for (; i + 16 <= hw; i += 16)
            for (int l = 0; l < 16; ++l) lanes[l] += src[i + l];
          float s = 0.0f;
          for (float v : lanes) s += v;
          for (; i < hw; ++i) s += src[i];
          y[p] = s / static_cast<float>(hw);
        }
      });
    };
    return make(n, g, run, 0, "cpu global avg_pool");
  }
  auto wh = windows(q.OH, q.H), ww = windows(q.OW, q.W);
  const int parts = parts_for(q.planes);
  const int64_t row_stride = (q.W + 15) / 16 * 16;
  auto run = [q, wh, ww, parts, row_stride](const float* x, float* y, float* rows) {
    for_parts(parts, [&](int part) {
      float* acc = rows + part * row_stride;
      for (int64_t p = q.planes * part / parts; p < q.planes * (part + 1) / parts; ++p)
        for (int64_t oh = 0; oh < q.OH; ++oh) {
          const int64_t h0 = (*wh)[size_t(2 * oh)], h1 = (*wh)[size_t(2 * oh + 1)];
          std::fill(acc, acc + q.W, 0.0f);
          for (int64_t ih = h0; ih < h1; ++ih) {
            const float* irow = x + (p * q.H + ih) * q.W;
            for (int64_t iw = 0; iw < q.W; ++iw) acc[iw] += irow[iw];
          }
          for (int64_t ow = 0; ow < q.OW; ++ow) {
            const int64_t w0 = (*ww)[size_t(2 * ow)], w1 = (*ww)[size_t(2 * ow + 1)];
            float s = 0.0f;
            for (int64_t iw = w0; iw < w1; ++iw) s += acc[iw];
            y[(p * q.OH + oh) * q.OW + ow] = s / static_cast<float>((h1 - h0) * (w1 - w0));
          }
        }
    });
  };
  return make(n, g, run, parts * row_stride, "cpu adaptive_avg_pool");
}

}  // namespace kiln::cpu
