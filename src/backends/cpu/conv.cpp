// CPU kernels of the conv family (NCHW; 1-D convs run as 2-D with a unit height, 2-D ones as
// 3-D with a unit depth, so a 3-D conv's output "rows" are its (depth, height) pairs).
//
// Three ways to run conv, picked at build time:
//   * 1x1, stride 1, no padding: the input already is the GEMM's B (weights [O, C] @ x[C, HW]);
//   * one input channel per group (depthwise, as in MobileNet) over at most 2 spatial dims: a
//     direct loop over a padded copy of each plane, every output tile accumulating all kernel
//     taps in a register (a GEMM would have K = 9 and waste its tiles);
//   * otherwise im2col into the workspace, then per group W[Og, Cg*kd*kh*kw] @ col (bias in
//     the GEMM epilogue).
// On the two GEMM paths a constant weight is packed into the GEMM's A panels once, when the
// kernel is made (GemmArgs::packed_a), not on every call.
// A fused conv's residual and activation (epilogue.h) run over the f32 output afterwards
// (relu alone rides in the GEMM's epilogue on the GEMM paths).
// conv_transpose (1 or 2 spatial dims) is the adjoint: col = W^T @ x per group (GEMM), then
// col2im scatters col into the output, parallel over output channels so no two threads write
// one plane.
// A channels-last conv (layout "nhwc") runs through channels-first copies (layout.cpp).
#include <algorithm>
#include <cstring>
#include <string>

#include "src/backends/cpu/epilogue.h"
#include "src/backends/cpu/gemm.h"
#include "src/ops/shape_rules.h"

namespace kiln::cpu {

namespace {

struct Geom {
  int64_t N, C, D, H, W;  // input (D = 1 below 3 spatial dims)
  int64_t O, OD, OH, OW;  // output
  int64_t KD, KH, KW, sd, sh, sw, pd, ph, pw, dd, dh, dw;
  int64_t groups, Cg, Og;
  int64_t taps() const { return KD * KH * KW; }
  int64_t in_plane() const { return D * H * W; }
  int64_t rows() const { return OD * OH; }  // output rows of OW elements, (depth, height) pairs
};

Geom geometry(const Node& n, const Graph& g) {
  const auto x = g.type(n.inputs[0]).shape(), w = g.type(n.inputs[1]).shape();
  const auto y = g.type(n.outputs[0]).shape();
  const size_t nsp = x.size() - 2;
  const Attrs& a = n.attrs;
  auto stride = a.get_ints("stride", std::vector<int64_t>(nsp, 1));
  auto pad = a.get_ints("padding", std::vector<int64_t>(nsp, 0));
  auto dil = a.get_ints("dilation", std::vector<int64_t>(nsp, 1));
  // Spatial dim i of 3 (depth, height, width) from the last nsp: absent leading ones are unit.
  const auto at = [nsp](const std::vector<int64_t>& v, size_t i, int64_t unit) {
    return i + nsp < 3 ? unit : v[v.size() - 3 + i];
  };
  Geom q{};
  q.N = x[0], q.C = x[1], q.D = at(x, 0, 1), q.H = at(x, 1, 1), q.W = x.back();
  q.O = y[1], q.OD = at(y, 0, 1), q.OH = at(y, 1, 1), q.OW = y.back();
  q.KD = at(w, 0, 1), q.KH = at(w, 1, 1), q.KW = w.back();
  q.sd = at(stride, 0, 1), q.sh = at(stride, 1, 1), q.sw = stride.back();
  q.pd = at(pad, 0, 0), q.ph = at(pad, 1, 0), q.pw = pad.back();
  q.dd = at(dil, 0, 1), q.dh = at(dil, 1, 1), q.dw = dil.back();
  q.groups = a.get_int("groups", 1);
  q.Cg = q.C / q.groups;
  q.Og = q.O / q.groups;
  return q;
}

// Depthwise (one input channel per group). Each plane is copied once into scratch with its
// zero padding and, for stride s, its columns split into s phases (padded column c lands in
// phase c % s at c / s), so every kernel tap reads a contiguous, unclipped run. Output rows
// are built in 16-wide tiles that accumulate every tap in a register and are stored once.
struct Depthwise {
  int64_t Hp = 0, Wpad = 0, phase_len = 0, row = 0;  // padded height / width; floats per phase, per row
  std::vector<int64_t> tap_off;                       // per tap (ki, kj): offset in the padded plane
  int parts = 1;
  // A tile past the row's end reads up to 15 floats of slack (its lanes are dropped).
  int64_t plane_floats() const { return (Hp * row + 31) / 16 * 16; }
};

Depthwise plan_depthwise(const Geom& q) {
  Depthwise d;
  d.Hp = q.H + 2 * q.ph;
  d.Wpad = q.W + 2 * q.pw;
  d.phase_len = (d.Wpad + q.sw - 1) / q.sw;
  d.row = q.sw * d.phase_len;
  for (int64_t ki = 0; ki < q.KH; ++ki)
    for (int64_t kj = 0; kj < q.KW; ++kj)
      d.tap_off.push_back(ki * q.dh * d.row + (kj * q.dw) % q.sw * d.phase_len + (kj * q.dw) / q.sw);
  d.parts = parts_for(q.N * q.O);
  return d;
}

typedef float v16 __attribute__((vector_size(64)));

void pad_plane(const Geom& q, const Depthwise& d, const float* x, float* dst) {
  for (int64_t r = 0; r < d.Hp; ++r) {
    float* drow = dst + r * d.row;
    const int64_t ih = r - q.ph;
    if (ih < 0 || ih >= q.H) {
      std::fill(drow, drow + d.row, 0.0f);
      continue;
    }
    const float* src = x + ih * q.W;
    if (q.sw == 1) {
      std::fill(drow, drow + q.pw, 0.0f);
      std::copy(src, src + q.W, drow + q.pw);
      std::fill(drow + q.pw + q.W, drow + d.row, 0.0f);
    } else {
      for (int64_t ph = 0; ph < q.sw; ++ph) {
        float* dp = drow + ph * d.phase_len;
        int64_t lo, hi;  // phase entries i whose column i * sw + ph is inside the input
        tap_range(d.phase_len, q.W, q.sw, ph - q.pw, lo, hi);
        std::fill(dp, dp + lo, 0.0f);
        for (int64_t i = lo; i < hi; ++i) dp[i] = src[i * q.sw + ph - q.pw];
        std::fill(dp + hi, dp + d.phase_len, 0.0f);
      }
    }
  }
}

void conv_depthwise(const Geom& q, const Depthwise& d, const float* x, const float* w, const float* bias, float* y,
                    float* scratch) {
  const int64_t planes = q.N * q.O, taps = q.KH * q.KW;
  for_parts(d.parts, [&](int part) {
    float* padded = scratch + part * d.plane_floats();
    for (int64_t p = planes * part / d.parts; p < planes * (part + 1) / d.parts; ++p) {
      const int64_t img = p / q.O, o = p % q.O;
      pad_plane(q, d, x + (img * q.C + o / q.Og) * q.H * q.W, padded);
      const float* wk = w + o * taps;
      const float bv = bias ? bias[o] : 0.0f;
      for (int64_t oh = 0; oh < q.OH; ++oh) {
        const float* base = padded + oh * q.sh * d.row;
        float* orow = y + (p * q.OH + oh) * q.OW;
        for (int64_t ow = 0; ow < q.OW; ow += 16) {
          v16 acc = v16{} + bv;
          for (int64_t t = 0; t < taps; ++t) {
            v16 src;
            std::memcpy(&src, base + d.tap_off[size_t(t)] + ow, sizeof src);
            acc += wk[t] * src;
          }
          std::memcpy(orow + ow, &acc, size_t(std::min<int64_t>(16, q.OW - ow)) * sizeof(float));
        }
      }
    }
  });
}

// col[(c, kd, ki, kj), (row - r0, ow)] = x[c, od*sd - pd + kd*dd, oh*sh - ph + ki*dh,
// ow*sw - pw + kj*dw] (0 in the padding), for the output rows r0 <= row = od * OH + oh < r1.
void im2col(const Geom& q, const float* x, float* col, int64_t r0, int64_t r1) {
  const int64_t rows = q.Cg * q.taps(), cols = (r1 - r0) * q.OW;
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t c = r / q.taps(), kd = (r / (q.KH * q.KW)) % q.KD, ki = (r / q.KW) % q.KH, kj = r % q.KW;
      const float* xc = x + c * q.in_plane();
      const int64_t off = kj * q.dw - q.pw;
      int64_t lo, hi;
      tap_range(q.OW, q.W, q.sw, off, lo, hi);
      for (int64_t row = r0; row < r1; ++row) {
        float* d = col + r * cols + (row - r0) * q.OW;
        const int64_t id = row / q.OH * q.sd - q.pd + kd * q.dd, ih = row % q.OH * q.sh - q.ph + ki * q.dh;
        if (id < 0 || id >= q.D || ih < 0 || ih >= q.H) {
          std::fill(d, d + q.OW, 0.0f);
          continue;
        }
        const float* irow = xc + (id * q.H + ih) * q.W;
        std::fill(d, d + lo, 0.0f);
        if (q.sw == 1) std::copy(irow + lo + off, irow + hi + off, d + lo);
        else
          for (int64_t ow = lo; ow < hi; ++ow) d[ow] = irow[ow * q.sw + off];
        std::fill(d + hi, d + q.OW, 0.0f);
      }
    }
  });
}

// `packed_w`: the weight in sgemm's A panels, one group after another (or null: packed per call).
// The im2col path builds `col` for `row_chunk` output rows at a time, each chunk one GEMM into
// its rows of y.
void conv_gemm(const Geom& q, bool pointwise, int64_t row_chunk, const float* x, const float* w, const float* packed_w,
               const float* bias, bool relu, float* y, float* col, float* gs, int threads) {
  const int64_t kdim = q.Cg * q.taps(), cols = q.rows() * q.OW;
  const int64_t step = pointwise ? q.rows() : row_chunk;
  for (int64_t img = 0; img < q.N; ++img)
    for (int64_t grp = 0; grp < q.groups; ++grp) {
      const float* xg = x + (img * q.C + grp * q.Cg) * q.in_plane();
      for (int64_t oh0 = 0; oh0 < q.rows(); oh0 += step) {
        const int64_t oh1 = std::min(q.rows(), oh0 + step), n = (oh1 - oh0) * q.OW;
        if (!pointwise) im2col(q, xg, col, oh0, oh1);
        GemmArgs ga = gemm_rowmajor(q.Og, n, kdim, w + grp * q.Og * kdim, kdim, pointwise ? xg : col, n, false,
                                    y + (img * q.O + grp * q.Og) * cols + oh0 * q.OW, cols);
        ga.bias = bias ? bias + grp * q.Og : nullptr;
        ga.bias_per_row = true;
        ga.packed_a = packed_w ? packed_w + grp * sgemm_packed_a_floats(q.Og, kdim) : nullptr;
        ga.relu = relu;
        sgemm(ga, gs, threads);
      }
    }
}

// x[N, C, H, W], w[C, Og, KH, KW] -> y[N, O, OH, OW].
void conv_transpose_gemm(const Geom& q, const float* x, const float* w, const float* bias, float* y, float* col,
                         float* gs, int threads) {
  const int64_t rows = q.Og * q.KH * q.KW, cols = q.H * q.W;
  for (int64_t img = 0; img < q.N; ++img)
    for (int64_t grp = 0; grp < q.groups; ++grp) {
      GemmArgs ga;
      ga.m = rows, ga.n = cols, ga.k = q.Cg;
      ga.a = w + grp * q.Cg * rows, ga.a_rs = 1, ga.a_cs = rows;  // W_g^T
      ga.b = x + (img * q.C + grp * q.Cg) * cols, ga.b_rs = cols, ga.b_cs = 1;
      ga.c = col, ga.ldc = cols;
      sgemm(ga, gs, threads);
      parallel_for(q.Og, 1, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          const int64_t oc = grp * q.Og + o;
          float* yo = y + (img * q.O + oc) * q.OH * q.OW;
          std::fill(yo, yo + q.OH * q.OW, bias ? bias[oc] : 0.0f);
          for (int64_t ki = 0; ki < q.KH; ++ki)
            for (int64_t kj = 0; kj < q.KW; ++kj) {
              const float* crow = col + ((o * q.KH + ki) * q.KW + kj) * cols;
              const int64_t off = kj * q.dw - q.pw;
              int64_t lo, hi;
              tap_range(q.W, q.OW, q.sw, off, lo, hi);
              for (int64_t ih = 0; ih < q.H; ++ih) {
                const int64_t oh = ih * q.sh - q.ph + ki * q.dh;
                if (oh < 0 || oh >= q.OH) continue;
                float* orow = yo + oh * q.OW;
                const float* src = crow + ih * q.W;
                for (int64_t iw = lo; iw < hi; ++iw) orow[iw * q.sw + off] += src[iw];
              }
            }
        }
      });
    }
}

enum class Path { kDirect, kPointwise, kIm2col, kTransposed };

}  // namespace

std::unique_ptr<Kernel> make_conv_kernel(const Node& n, const Graph& g, size_t workspace_limit,
                                         DerivedConstants* derived) {
  KILN_CHECK(n.op == OpKind::kConv || n.op == OpKind::kConvTranspose, kInternal, op_name(n.op),
             " is not in the conv family");
  if (channels_last(n.op, n.attrs))
    return make_channels_last(n, g, {0, 1, 3}, [workspace_limit, derived](const Node& inner, const Graph& ig) {
      return make_conv_kernel(inner, ig, workspace_limit, derived);
    });
  const Geom q = geometry(n, g);
  const DType dt = g.type(n.inputs[0]).dtype;
  const int64_t y_numel = g.type(n.outputs[0]).numel();
  Path path = Path::kTransposed;
  int64_t col_floats = 0, gemm_floats = 0;
  Depthwise dw;
  const int threads = num_threads();
  int64_t row_chunk = q.rows();
  if (n.op == OpKind::kConv) {
    const bool one_by_one = q.taps() == 1 && q.sd == 1 && q.sh == 1 && q.sw == 1 && q.pd == 0 && q.ph == 0 && q.pw == 0;
    const bool planar = g.type(n.inputs[0]).rank() <= 4;  // the direct depthwise loop is 2-D
    path = one_by_one ? Path::kPointwise : q.Cg == 1 && planar ? Path::kDirect : Path::kIm2col;
    if (path == Path::kDirect) {
      dw = plan_depthwise(q);
      col_floats = dw.parts * dw.plane_floats();
    }
    if (path == Path::kPointwise) gemm_floats = sgemm_scratch_floats(q.Og, q.rows() * q.OW, q.Cg, threads);
  } else {
    col_floats = q.Og * q.KH * q.KW * q.H * q.W;
    gemm_floats = sgemm_scratch_floats(q.Og * q.KH * q.KW, q.H * q.W, q.Cg, threads);
  }
  ValueId bias_id = n.inputs.size() > 2 ? n.inputs[2] : kNoValue;
  F32Input x(g, n.inputs[0]), w(g, n.inputs[1]), bias(g, bias_id);
  // A constant weight of the GEMM paths is packed into sgemm's A panels here, once, instead of
  // on every call (sgemm packs only problems of more than kFewRows rows).
  std::shared_ptr<const float[]> packed_w;
  if ((path == Path::kPointwise || path == Path::kIm2col) && g.value(n.inputs[1]).is_constant() &&
      q.Og > kFewRows) {
    const int64_t kdim = q.Cg * q.taps(), per = sgemm_packed_a_floats(q.Og, kdim);
    auto pack = [&]() -> std::shared_ptr<const void> {
      const float* wf = w.get(g.value(n.inputs[1]).data->data(), nullptr);  // a constant needs no scratch
      std::shared_ptr<float[]> packed(new float[size_t(per * q.groups)]);
      for (int64_t grp = 0; grp < q.groups; ++grp)
        sgemm_pack_a_parallel(q.Og, kdim, wf + grp * q.Og * kdim, kdim, 1, packed.get() + grp * per);
      return packed;
    };
    // The engine's instances share what its kernels packed.
    const std::string what =
        detail::concat("sgemm a ", dtype_name(g.type(n.inputs[1]).dtype), " ", q.groups, "x", q.Og, "x", kdim);
    packed_w =
        std::static_pointer_cast<const float[]>(derived ? derived->get(g.value(n.inputs[1]).data, what, pack) : pack());
  }
  const Epilogue epi(n, g);
  // relu in the GEMM's epilogue on the GEMM paths; everything else after the conv.
  const bool gemm_relu = epi.gemm_relu() && (path == Path::kPointwise || path == Path::kIm2col);
  const size_t n_inputs = n.inputs.size();

  auto workspace_for = [&](int64_t col, int64_t gemm) {
    Carver sizes;
    for (int64_t floats : {x.scratch_floats(), w.scratch_floats(), bias.scratch_floats(),
                           dt == DType::kF32 ? int64_t(0) : y_numel, col, gemm, epi.scratch_floats()})
      sizes.take(floats);
    return sizes.used();
  };
  if (path == Path::kIm2col) {
    // The whole im2col matrix when it fits the workspace limit, else the largest chunk of output
    // rows that does (one row at the least: a limit below that fails the engine's own check).
    const int64_t kdim = q.Cg * q.taps();
    for (;; row_chunk = (row_chunk + 1) / 2) {
      col_floats = kdim * row_chunk * q.OW;
      gemm_floats = sgemm_scratch_floats(q.Og, row_chunk * q.OW, kdim, threads);
      if (row_chunk == 1 || workspace_for(col_floats, gemm_floats) <= workspace_limit) break;
    }
  }
  const size_t ws = workspace_for(col_floats, gemm_floats);
  const char* name = op_name(n.op);

  auto fn = [=](const void* const* in, void* const* out, const RunContext& ctx) {
    check_workspace(ctx, ws, name);
    Carver c(ctx.workspace);
    const float* X = x.get(in[0], c.take(x.scratch_floats()));
    const float* Wt = w.get(in[1], c.take(w.scratch_floats()));
    float* bs = c.take(bias.scratch_floats());
    const float* B = bias.present() ? bias.get(in[2], bs) : nullptr;
    float* ys = c.take(dt == DType::kF32 ? 0 : y_numel);
    float* Y = dt == DType::kF32 ? static_cast<float*>(out[0]) : ys;
    float* col = c.take(col_floats);
    float* gs = c.take(gemm_floats);
    switch (path) {
      case Path::kDirect: conv_depthwise(q, dw, X, Wt, B, Y, col); break;
      case Path::kPointwise:
        conv_gemm(q, true, q.rows(), X, Wt, packed_w.get(), B, gemm_relu, Y, col, gs, threads);
        break;
      case Path::kIm2col:
        conv_gemm(q, false, row_chunk, X, Wt, packed_w.get(), B, gemm_relu, Y, col, gs, threads);
        break;
      case Path::kTransposed: conv_transpose_gemm(q, X, Wt, B, Y, col, gs, threads); break;
    }
    float* es = c.take(epi.scratch_floats());
    epi.apply(Y, n_inputs > 3 ? in[3] : nullptr, es, gemm_relu);
    if (dt != DType::kF32) from_f32_parallel(Y, dt, out[0], y_numel);
  };
  static const char* const kDesc[] = {"cpu conv direct (depthwise)", "cpu conv 1x1 sgemm", "cpu conv im2col + sgemm",
                                      "cpu conv_transpose sgemm + col2im"};
  std::string desc = kDesc[static_cast<int>(path)] + epi.describe() + (packed_w ? " (prepacked weight)" : "");
  if (row_chunk < q.rows())
    desc += " (im2col in chunks of " + std::to_string(row_chunk) + " output rows: workspace limit)";
  return make_fn_kernel(fn, desc, ws);
}

}  // namespace kiln::cpu
