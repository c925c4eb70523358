// CPU kernels of the normalization family (inference): batch_norm with running statistics,
// layer_norm over the last k dims, group_norm over (sample, group) of [N, C, ...] or, with layout
// "nhwc", of [N, H, W, C].
//
// Statistics compute in f32 (f64 for f64 tensors), two-pass (mean, then squared deviations)
// with accumulator lanes so the loops vectorize; variance is the biased (population) one, as
// PyTorch normalizes. An RMS layer_norm ({rms}) takes the mean as 0: its variance is the mean of
// squares. layer_norm and group_norm then compute (x - mean) * scale + bias, with
// scale = rstd times the weight (subtracting the mean first keeps low-variance groups exact);
// batch_norm folds its running statistics into x * scale + shift per channel, once per run.
// Parameters of another dtype than the compute type are converted into the workspace each run
// (they are small, and weights may be refitted between runs, so nothing is cached). A fused
// activation (layer_norm, group_norm) applies to the computed values before they are rounded to
// y's dtype, as the CUDA kernels apply it in registers.
#include <algorithm>
#include <cmath>
#include <vector>

#include "src/backends/cpu/kernels.h"
#include "src/ops/epilogue.h"
#include "src/ops/pointwise.h"
#include "src/ops/shape_rules.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kWork = 16384;  // elements per parallel chunk, at least
constexpr int kLanes = 16;

struct Param {
  bool present = false;
  DType dtype = DType::kF32;
  int64_t n = 0;
};

Param param(const Graph& g, const Node& node, size_t i) {
  Param p;
  if (i >= node.inputs.size() || node.inputs[i] == kNoValue) return p;
  p.present = true;
  p.dtype = g.type(node.inputs[i]).dtype;
  p.n = g.type(node.inputs[i]).numel();
  return p;
}

// Parameter i as an array of C: the caller's buffer when it already is C, else converted into
// scratch (which holds p.n elements). Absent: null.
template <typename C>
const C* as_compute(const Param& p, const void* data, C* scratch) {
  if (!p.present) return nullptr;
  constexpr DType want = std::is_same_v<C, double> ? DType::kF64 : DType::kF32;
  if (p.dtype == want) return static_cast<const C*>(data);
  for (int64_t i = 0; i < p.n; ++i) scratch[i] = static_cast<C>(load_as_double(data, p.dtype, i));
  return scratch;
}

// Mean and 1 / sqrt(var + eps) of n contiguous elements (rms: mean 0, var the mean of squares).
template <DType D>
void stats(const typename pw::Elem<D>::S* x, int64_t n, double eps, bool rms, typename pw::Elem<D>::C& mean,
           typename pw::Elem<D>::C& rstd) {
  using E = pw::Elem<D>;
  using C = typename E::C;
  C lanes[kLanes] = {};
  int64_t i = 0;
  double s = 0;
  if (!rms) {
    for (; i + kLanes <= n; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lanes[j] += E::load(x[i + j]);
    for (; i < n; ++i) s += E::load(x[i]);
    for (C l : lanes) s += l;
  }
  const C m = static_cast<C>(s / double(std::max<int64_t>(n, 1)));
  for (C& l : lanes) l = 0;
  for (i = 0; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lanes[j] += (E::load(x[i + j]) - m) * (E::load(x[i + j]) - m);
  double v = 0;
  for (; i < n; ++i) v += double(E::load(x[i]) - m) * double(E::load(x[i]) - m);
  for (C l : lanes) v += l;
  mean = m;
  rstd = static_cast<C>(1.0 / std::sqrt(v / double(std::max<int64_t>(n, 1)) + eps));
}

// Hands out 64-byte aligned arrays from the workspace (sizes only when base is null).
struct Carve {
  char* base;
  size_t used = 0;
  template <typename C>
  C* take(int64_t n) {
    char* p = base ? base + used : nullptr;
    used += (size_t(n) * sizeof(C) + 63) / 64 * 64;
    return reinterpret_cast<C*>(p);
  }
};

void check_workspace(const RunContext& ctx, size_t need, OpKind op) {
  KILN_CHECK(need == 0 || (ctx.workspace && ctx.workspace_size >= need), kInternal, op_name(op), ": workspace of ",
             ctx.workspace_size, " bytes, kernel needs ", need);
}

struct Setup {
  OpKind op;
  int64_t outer = 1, channels = 1, inner = 1;  // layer_norm: rows, -, D; norms over [N, C, S]: N, C, S
  int64_t groups = 1;
  bool channels_last = false;  // group_norm of x [N, S, C]
  double eps = 1e-5;
  bool rms = false;  // layer_norm {rms}
  Param p[4];  // layer/group_norm: weight, bias; batch_norm: mean, var, weight, bias
  pw::Activation act;  // layer/group_norm's fused activation
  size_t workspace = 0;
};

// Applies the fused activation to v[0, n) in place, then stores it to y[0], y[stride], ...
template <DType D>
void activate_store(const pw::Activation& act, typename pw::Elem<D>::C* v, int64_t n, typename pw::Elem<D>::S* y,
                    int64_t stride) {
  if (!act.none) pw::unary_array(act.op, act.params, v, v, n);
  for (int64_t i = 0; i < n; ++i) y[i * stride] = pw::Elem<D>::store(v[i]);
}

bool needs_convert(const Param& p, bool dbl) { return p.present && p.dtype != (dbl ? DType::kF64 : DType::kF32); }

// The workspace arrays of one run; with a null base, only their total size.
template <typename C>
struct Buffers {
  C* prm[4] = {};  // conversion scratch per parameter (null when none is needed)
  C* scale = nullptr;
  C* shift = nullptr;
  Buffers(Carve& c, const Setup& st) {
    constexpr bool dbl = std::is_same_v<C, double>;
    for (int i = 0; i < 4; ++i) prm[i] = c.take<C>(needs_convert(st.p[i], dbl) ? st.p[i].n : 0);
    if (st.op == OpKind::kBatchNorm) scale = c.take<C>(st.channels), shift = c.take<C>(st.channels);
  }
};

template <DType D>
KernelFn make_typed(Setup& st) {
  using E = pw::Elem<D>;
  using S = typename E::S;
  using C = typename E::C;
  Carve sizes{nullptr};
  Buffers<C> sizing(sizes, st);
  st.workspace = sizes.used;
  return [st](const void* const* in, void* const* out, const RunContext& ctx) {
    check_workspace(ctx, st.workspace, st.op);
    const S* x = static_cast<const S*>(in[0]);
    S* y = static_cast<S*>(out[0]);
    Carve carve{static_cast<char*>(ctx.workspace)};
    Buffers<C> buf(carve, st);
    const C* prm[4] = {};
    for (int i = 0; i < 4; ++i)
      if (st.p[i].present) prm[i] = as_compute<C>(st.p[i], in[i + 1], buf.prm[i]);

    if (st.op == OpKind::kLayerNorm) {
      const int64_t D_ = st.inner;
      parallel_for(st.outer, std::max<int64_t>(1, kWork / std::max<int64_t>(D_, 1)), [&](int64_t b, int64_t e) {
        std::vector<C> row(static_cast<size_t>(D_));
        for (int64_t r = b; r < e; ++r) {
          const S* xr = x + r * D_;
          C mean, rstd;
          stats<D>(xr, D_, st.eps, st.rms, mean, rstd);
          const C *w = prm[0], *bias = prm[1];
          for (int64_t i = 0; i < D_; ++i) {
            C v = (E::load(xr[i]) - mean) * rstd;
            if (w) v *= w[i];
            if (bias) v += bias[i];
            row[size_t(i)] = v;
          }
          activate_store<D>(st.act, row.data(), D_, y + r * D_, 1);
        }
      });
      return;
    }

    const int64_t N = st.outer, Ch = st.channels, Sp = st.inner;
    if (st.op == OpKind::kBatchNorm) {
      C* scale = buf.scale;
      C* shift = buf.shift;
      for (int64_t c = 0; c < Ch; ++c) {
        const double sc = (prm[2] ? double(prm[2][c]) : 1.0) / std::sqrt(double(prm[1][c]) + st.eps);
        scale[c] = C(sc);
        shift[c] = C((prm[3] ? double(prm[3][c]) : 0.0) - double(prm[0][c]) * sc);
      }
      if (Sp == 1) {  // [N, C]: rows of channels
        parallel_for(N, std::max<int64_t>(1, kWork / std::max<int64_t>(Ch, 1)), [&](int64_t b, int64_t e) {
          for (int64_t n = b; n < e; ++n)
            for (int64_t c = 0; c < Ch; ++c) y[n * Ch + c] = E::store(E::load(x[n * Ch + c]) * scale[c] + shift[c]);
        });
        return;
      }
      parallel_for(N * Ch, std::max<int64_t>(1, kWork / std::max<int64_t>(Sp, 1)), [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          const C sc = scale[t % Ch], sh = shift[t % Ch];
          const S* xr = x + t * Sp;
          S* yr = y + t * Sp;
          for (int64_t i = 0; i < Sp; ++i) yr[i] = E::store(E::load(xr[i]) * sc + sh);
        }
      });
      return;
    }

    const int64_t G = st.groups, Cg = Ch / G;
    if (st.channels_last) {  // group (n, g): Cg channels at stride Ch in each of the Sp positions
      parallel_for(N * G, std::max<int64_t>(1, kWork / std::max<int64_t>(Cg * Sp, 1)), [&](int64_t b, int64_t e) {
        std::vector<C> run(static_cast<size_t>(Sp));
        for (int64_t t = b; t < e; ++t) {
          const int64_t base = (t / G) * Sp * Ch + (t % G) * Cg;
          const double count = double(std::max<int64_t>(Cg * Sp, 1));
          double s = 0;
          for (int64_t i = 0; i < Sp; ++i)
            for (int64_t k = 0; k < Cg; ++k) s += E::load(x[base + i * Ch + k]);
          const C mean = static_cast<C>(s / count);
          double v = 0;
          for (int64_t i = 0; i < Sp; ++i)
            for (int64_t k = 0; k < Cg; ++k) {
              const double d = double(E::load(x[base + i * Ch + k]) - mean);
              v += d * d;
            }
          const C rstd = static_cast<C>(1.0 / std::sqrt(v / count + st.eps));
          for (int64_t k = 0; k < Cg; ++k) {
            const int64_t c = (t % G) * Cg + k;
            const C sc = rstd * (prm[0] ? prm[0][c] : C(1));
            const C sh = prm[1] ? prm[1][c] : C(0);
            for (int64_t i = 0; i < Sp; ++i) run[size_t(i)] = (E::load(x[base + i * Ch + k]) - mean) * sc + sh;
            activate_store<D>(st.act, run.data(), Sp, y + base + k, Ch);
          }
        }
      });
      return;
    }
    // group_norm: each (sample, group) is one contiguous block of Cg * Sp elements.
    parallel_for(N * G, std::max<int64_t>(1, kWork / std::max<int64_t>(Cg * Sp, 1)), [&](int64_t b, int64_t e) {
      std::vector<C> run(static_cast<size_t>(Sp));
      for (int64_t t = b; t < e; ++t) {
        const S* xg = x + t * Cg * Sp;
        S* yg = y + t * Cg * Sp;
        C mean, rstd;
        stats<D>(xg, Cg * Sp, st.eps, false, mean, rstd);
        for (int64_t k = 0; k < Cg; ++k) {
          const int64_t c = (t % G) * Cg + k;
          const C sc = rstd * (prm[0] ? prm[0][c] : C(1));
          const C sh = prm[1] ? prm[1][c] : C(0);
          for (int64_t i = 0; i < Sp; ++i) run[size_t(i)] = (E::load(xg[k * Sp + i]) - mean) * sc + sh;
          activate_store<D>(st.act, run.data(), Sp, yg + k * Sp, 1);
        }
      }
    });
  };
}

}  // namespace

std::unique_ptr<Kernel> make_norm_kernel(const Node& n, const Graph& g) {
  const TensorType& xt = g.type(n.inputs[0]);
  const std::vector<int64_t> shape = xt.shape();
  Setup st;
  st.op = n.op;
  st.eps = n.attrs.get_float("eps", 1e-5);
  st.act = pw::parse_activation(n.op, n.attrs);  // none for batch_norm (its shape rule)
  if (n.op == OpKind::kLayerNorm) {
    const auto k = static_cast<size_t>(n.attrs.get_int("normalized_rank", 1));
    for (size_t d = 0; d < shape.size(); ++d) (d + k < shape.size() ? st.outer : st.inner) *= shape[d];
    st.rms = n.attrs.get_bool("rms", false);
  } else {
    st.channels_last = channels_last(n.op, n.attrs);  // group_norm [N, H, W, C]
    const size_t c = st.channels_last ? 3 : 1;
    st.outer = shape.at(0);
    st.channels = shape.at(c);
    for (size_t d = 1; d < shape.size(); ++d)
      if (d != c) st.inner *= shape[d];
    if (n.op == OpKind::kGroupNorm) st.groups = n.attrs.get_int("groups");
  }
  for (size_t i = 0; i < 4; ++i) st.p[i] = param(g, n, i + 1);
  KernelFn fn;
  switch (xt.dtype) {
    case DType::kF32: fn = make_typed<DType::kF32>(st); break;
    case DType::kF64: fn = make_typed<DType::kF64>(st); break;
    case DType::kF16: fn = make_typed<DType::kF16>(st); break;
    case DType::kBF16: fn = make_typed<DType::kBF16>(st); break;
    default: KILN_FAIL(kUnsupported, op_name(n.op), ": x must be floating, got ", xt.to_string());
  }
  return make_fn_kernel(std::move(fn),
                        std::string("cpu ") + op_name(n.op) + (st.rms ? " (rms) " : " ") + xt.to_string() +
                            (st.act.none ? "" : " + " + st.act.name),
                        st.workspace);
}

}  // namespace kiln::cpu
