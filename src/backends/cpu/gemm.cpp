// SGEMM: packed panels + a register-blocked micro-kernel (the Goto/BLIS loop nest).
//
// Loop nest per part: columns in kNC blocks -> depth in kKC blocks (pack B: kKC x kNC, shared
// by the rows below, L2/L3 resident) -> rows in kMC blocks (pack A: kMC x kKC, L2 resident)
// -> kNR x kMR micro-tiles, each a rank-kKC update held in registers. Parallel runs split C
// into a grid of parts that pack for themselves; that repeats some packing but needs no
// synchronization, which is the better trade on few cores. A B packed ahead of time (a
// constant weight) is read in place. Problems of at most kFewRows rows, and n == 1 ones, skip
// packing altogether (it would cost as much as the product): dot products or row updates
// that read B once.
#include "src/backends/cpu/gemm.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace kiln::cpu {

namespace {

#if defined(__AVX512F__)
constexpr int kV = 16;  // floats per vector register
constexpr int kMR = 14;  // 28 accumulators of the 32 registers
#elif defined(__AVX__)
constexpr int kV = 8;
constexpr int kMR = 6;  // 12 accumulators of 16 registers
#else
constexpr int kV = 4;
constexpr int kMR = 6;
#endif
constexpr int kNR = 2 * kV;
constexpr int64_t kKC = 256;
constexpr int64_t kMC = kMR * 8;
constexpr int64_t kNC = kNR * 48;

typedef float vf __attribute__((vector_size(kV * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(kV * sizeof(float))));

inline vf loadv(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void storev(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
inline vf relu_v(vf v) { return (vf)((vi)v & ~(vi)(v < vf{})); }  // keeps NaN, as torch.relu does

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Where one micro-tile lands in C and what the epilogue adds.
struct Tile {
  const GemmArgs* g;
  int64_t row, col;
  int mr, nr;
  bool first, last;  // first / last depth block
};

inline float finish_scalar(const GemmArgs& g, float acc, int64_t i, int64_t j, bool first, bool last) {
  float* cp = g.c + i * g.ldc + j;
  float v = g.alpha * acc;
  if (!first) v += *cp;
  else if (g.beta != 0.0f) v += g.beta * *cp;
  if (last) {
    if (g.bias) v += g.bias[g.bias_per_row ? i : j];
    if (g.relu) v = v < 0.0f ? 0.0f : v;
  }
  return *cp = v;
}

// C tile += A panel (kc x kMR, depth-major) * B panel (kc x kNR, depth-major).
void micro_kernel(int64_t kc, const float* __restrict a, const float* __restrict b, const Tile& t) {
  vf acc[kMR][2];
#pragma GCC unroll 16
  for (int i = 0; i < kMR; ++i) acc[i][0] = acc[i][1] = vf{};
  for (int64_t p = 0; p < kc; ++p) {
    vf b0 = loadv(b), b1 = loadv(b + kV);
#pragma GCC unroll 16
    for (int i = 0; i < kMR; ++i) {
      vf ai = vf{} + a[i];
      acc[i][0] += ai * b0;
      acc[i][1] += ai * b1;
    }
    a += kMR;
    b += kNR;
  }
  const GemmArgs& g = *t.g;
  if (t.mr == kMR && t.nr == kNR) {
    vf bias_c[2] = {vf{}, vf{}};
    bool col_bias = t.last && g.bias && !g.bias_per_row;
    if (col_bias) bias_c[0] = loadv(g.bias + t.col), bias_c[1] = loadv(g.bias + t.col + kV);
    for (int i = 0; i < kMR; ++i) {
      float* cp = g.c + (t.row + i) * g.ldc + t.col;
      for (int h = 0; h < 2; ++h) {
        vf v = acc[i][h] * g.alpha;
        if (!t.first) v += loadv(cp + h * kV);
        else if (g.beta != 0.0f) v += g.beta * loadv(cp + h * kV);
        if (t.last) {
          if (col_bias) v += bias_c[h];
          else if (g.bias) v += g.bias[t.row + i];
          if (g.relu) v = relu_v(v);
        }
        storev(cp + h * kV, v);
      }
    }
    return;
  }
  alignas(64) float tmp[kMR * kNR];
  for (int i = 0; i < kMR; ++i) storev(tmp + i * kNR, acc[i][0]), storev(tmp + i * kNR + kV, acc[i][1]);
  for (int i = 0; i < t.mr; ++i)
    for (int j = 0; j < t.nr; ++j) finish_scalar(g, tmp[i * kNR + j], t.row + i, t.col + j, t.first, t.last);
}

// Rows [0, mc) x depth [0, kc) of A into kMR-row panels, depth-major, zero-padded.
void pack_a(int64_t mc, int64_t kc, const float* a, int64_t rs, int64_t cs, float* dst) {
  for (int64_t i0 = 0; i0 < mc; i0 += kMR, dst += kMR * kc) {
    int mr = static_cast<int>(std::min<int64_t>(kMR, mc - i0));
    if (cs == 1) {
      for (int i = 0; i < mr; ++i) {
        const float* src = a + (i0 + i) * rs;
        for (int64_t p = 0; p < kc; ++p) dst[p * kMR + i] = src[p];
      }
    } else {
      for (int64_t p = 0; p < kc; ++p)
        for (int i = 0; i < mr; ++i) dst[p * kMR + i] = a[(i0 + i) * rs + p * cs];
    }
    if (mr < kMR)
      for (int64_t p = 0; p < kc; ++p)
        for (int i = mr; i < kMR; ++i) dst[p * kMR + i] = 0.0f;
  }
}

// Depth [0, kc) x columns [0, nc) of B into kNR-column panels, depth-major, zero-padded.
void pack_b(int64_t kc, int64_t nc, const float* b, int64_t rs, int64_t cs, float* dst) {
  for (int64_t j0 = 0; j0 < nc; j0 += kNR, dst += kNR * kc) {
    int nr = static_cast<int>(std::min<int64_t>(kNR, nc - j0));
    if (cs == 1 && nr == kNR) {
      for (int64_t p = 0; p < kc; ++p) {
        const float* src = b + p * rs + j0;
        storev(dst + p * kNR, loadv(src));
        storev(dst + p * kNR + kV, loadv(src + kV));
      }
      continue;
    }
    if (rs == 1) {
      // Transposed B: 8x8 tiles, read along depth and written along columns, so both sides
      // move whole vectors.
      int64_t p0 = 0;
      if (nr == kNR) {
        for (; p0 + 8 <= kc; p0 += 8)
          for (int j0b = 0; j0b < kNR; j0b += 8) {
            float t[8][8];
            for (int jj = 0; jj < 8; ++jj)
              for (int pp = 0; pp < 8; ++pp) t[pp][jj] = b[(j0 + j0b + jj) * cs + p0 + pp];
            for (int pp = 0; pp < 8; ++pp)
              for (int jj = 0; jj < 8; ++jj) dst[(p0 + pp) * kNR + j0b + jj] = t[pp][jj];
          }
      }
      for (int j = 0; j < nr; ++j) {
        const float* src = b + (j0 + j) * cs;
        for (int64_t p = p0; p < kc; ++p) dst[p * kNR + j] = src[p];
      }
    } else {
      for (int64_t p = 0; p < kc; ++p)
        for (int j = 0; j < nr; ++j) dst[p * kNR + j] = b[p * rs + (j0 + j) * cs];
    }
    if (nr < kNR)
      for (int64_t p = 0; p < kc; ++p)
        for (int j = nr; j < kNR; ++j) dst[p * kNR + j] = 0.0f;
  }
}

int64_t pack_a_floats(int64_t m, int64_t k) { return round_up(round_up(std::min(kMC, m), kMR) * std::min(kKC, k), 16); }
int64_t pack_b_floats(int64_t n, int64_t k) { return round_up(std::min(kKC, k) * round_up(std::min(kNC, n), kNR), 16); }

// The loop nest over C rows [i0, i1) x columns [j0, j1). With g.packed_b (g.packed_a), B's (A's)
// panels are already laid out, full depth per kNR columns (kMR rows), and are read in place;
// row parts start on whole kMR panels (make_plan), so (ic + ir) / kMR names one.
void gemm_block(const GemmArgs& g, int64_t i0, int64_t i1, int64_t j0, int64_t j1, float* ap, float* bp) {
  for (int64_t jc = j0; jc < j1; jc += kNC) {
    int64_t nc = std::min(kNC, j1 - jc);
    for (int64_t pc = 0; pc < g.k; pc += kKC) {
      int64_t kc = std::min(kKC, g.k - pc);
      if (!g.packed_b) pack_b(kc, nc, g.b + pc * g.b_rs + jc * g.b_cs, g.b_rs, g.b_cs, bp);
      for (int64_t ic = i0; ic < i1; ic += kMC) {
        int64_t mc = std::min(kMC, i1 - ic);
        if (!g.packed_a) pack_a(mc, kc, g.a + ic * g.a_rs + pc * g.a_cs, g.a_rs, g.a_cs, ap);
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const float* bpanel = g.packed_b ? g.packed_b + (jc + jr) / kNR * (g.k * kNR) + pc * kNR : bp + jr * kc;
          for (int64_t ir = 0; ir < mc; ir += kMR) {
            Tile t{&g, ic + ir, jc + jr, static_cast<int>(std::min<int64_t>(kMR, mc - ir)),
                   static_cast<int>(std::min<int64_t>(kNR, nc - jr)), pc == 0, pc + kc >= g.k};
            const float* apanel = g.packed_a ? g.packed_a + (ic + ir) / kMR * (g.k * kMR) + pc * kMR : ap + ir * kc;
            micro_kernel(kc, apanel, bpanel, t);
          }
        }
      }
    }
  }
}

// C rows [0, M) (M <= kFewRows) with B = W^T, W rows contiguous along depth: per column j,
// M dot products that share each load of W's row (read once, at memory speed).
template <int M>
void few_rows_dots(const GemmArgs& g, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    const float* w = g.b + j * g.b_cs;
    vf acc[M][2] = {};
    int64_t p = 0;
    for (; p + 2 * kV <= g.k; p += 2 * kV) {
      vf w0 = loadv(w + p), w1 = loadv(w + p + kV);
      for (int i = 0; i < M; ++i) {
        acc[i][0] += loadv(g.a + i * g.a_rs + p) * w0;
        acc[i][1] += loadv(g.a + i * g.a_rs + p + kV) * w1;
      }
    }
    for (int i = 0; i < M; ++i) {
      vf v = acc[i][0] + acc[i][1];
      float r = 0.0f;
      for (int l = 0; l < kV; ++l) r += v[l];
      for (int64_t q = p; q < g.k; ++q) r += g.a[i * g.a_rs + q] * w[q];
      finish_scalar(g, r, i, j, true, true);
    }
  }
}

// C rows [0, m) (m <= kFewRows) with B rows contiguous along columns: C rows += A(i, p) * B row
// p, in column chunks held on the stack (B read once).
void few_rows_axpy(const GemmArgs& g, int64_t j0, int64_t j1) {
  constexpr int64_t kChunk = 256;
  alignas(64) float acc[kFewRows][kChunk];
  for (int64_t jc = j0; jc < j1; jc += kChunk) {
    const int64_t nc = std::min(kChunk, j1 - jc);
    for (int64_t i = 0; i < g.m; ++i) std::fill(acc[i], acc[i] + nc, 0.0f);
    for (int64_t p = 0; p < g.k; ++p) {
      const float* brow = g.b + p * g.b_rs + jc;
      for (int64_t i = 0; i < g.m; ++i) {
        const float ap = g.a[i * g.a_rs + p * g.a_cs];
        for (int64_t j = 0; j < nc; ++j) acc[i][j] += ap * brow[j];
      }
    }
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < nc; ++j) finish_scalar(g, acc[i][j], i, jc + j, true, true);
  }
}

// n == 1 with A rows and B's column contiguous along depth: one dot product per row.
void column_dots(const GemmArgs& g, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float* a = g.a + i * g.a_rs;
    vf acc[2] = {};
    int64_t p = 0;
    for (; p + 2 * kV <= g.k; p += 2 * kV) {
      acc[0] += loadv(a + p) * loadv(g.b + p);
      acc[1] += loadv(a + p + kV) * loadv(g.b + p + kV);
    }
    vf v = acc[0] + acc[1];
    float r = 0.0f;
    for (int l = 0; l < kV; ++l) r += v[l];
    for (; p < g.k; ++p) r += a[p] * g.b[p];
    finish_scalar(g, r, i, 0, true, true);
  }
}

struct Plan {
  int pm = 1, pn = 1;
  int64_t mp = 0, np = 0;  // rows / columns per part
};

// Parts worth a thread of their own: waking one costs microseconds, so each part gets at
// least kMinPartWork multiply-adds. Monotonic in every argument, as the scratch size must be.
constexpr double kMinPartWork = double(1 << 19);
int effective_parts(int64_t m, int64_t n, int64_t k, int max_parts) {
  const double parts = double(m) * double(n) * double(k) / kMinPartWork;
  return parts < 1.0 ? 1 : static_cast<int>(std::min(parts, double(std::max(1, max_parts))));
}

Plan make_plan(int64_t m, int64_t n, int64_t k, int max_parts) {
  Plan best{1, 1, m, n};
  max_parts = effective_parts(m, n, k, max_parts);
  if (max_parts <= 1) return best;
  double best_cost = std::numeric_limits<double>::infinity();
  for (int pm = 1; pm <= max_parts; ++pm) {
    int pn = max_parts / pm;
    int64_t mp = round_up(ceil_div(m, pm), kMR), np = round_up(ceil_div(n, pn), kNR);
    // Work of the largest part, with packing weighted as a slow (memory-bound) pass.
    double cost = double(mp) * double(np) * double(k) + 16.0 * double(k) * double(mp + np);
    if (cost < best_cost) {
      best_cost = cost;
      best = Plan{static_cast<int>(ceil_div(m, mp)), static_cast<int>(ceil_div(n, np)), mp, np};
    }
  }
  return best;
}

}  // namespace

int64_t sgemm_scratch_floats(int64_t m, int64_t n, int64_t k, int max_parts) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  return int64_t(effective_parts(m, n, k, max_parts)) * (pack_a_floats(m, k) + pack_b_floats(n, k));
}

void sgemm(const GemmArgs& g, float* scratch, int max_parts) {
  if (g.m <= 0 || g.n <= 0) return;
  if (g.k <= 0) {
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) finish_scalar(g, 0.0f, i, j, true, true);
    return;
  }
  const int parts = std::max(1, max_parts);
  auto split = [&](int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (effective_parts(g.m, g.n, g.k, parts) > 1)
      parallel_for(n, std::max<int64_t>(16, int64_t(kMinPartWork) / (g.k * g.m)), fn);
    else fn(0, n);
  };
  if (g.m <= kFewRows && g.b_rs == 1 && g.a_cs == 1) {  // B = W^T: dot products with W's rows
    switch (g.m) {
      case 1: return split(g.n, [&](int64_t a, int64_t b) { few_rows_dots<1>(g, a, b); });
      case 2: return split(g.n, [&](int64_t a, int64_t b) { few_rows_dots<2>(g, a, b); });
      case 3: return split(g.n, [&](int64_t a, int64_t b) { few_rows_dots<3>(g, a, b); });
      default: return split(g.n, [&](int64_t a, int64_t b) { few_rows_dots<4>(g, a, b); });
    }
  }
  if (g.m <= kFewRows && g.b_cs == 1) return split(g.n, [&](int64_t a, int64_t b) { few_rows_axpy(g, a, b); });
  if (g.n == 1 && g.a_cs == 1 && g.b_rs == 1)
    return split(g.m, [&](int64_t a, int64_t b) { column_dots(g, a, b); });
  KILN_CHECK(scratch != nullptr, kInternal, "sgemm: no scratch for packing");
  Plan plan = make_plan(g.m, g.n, g.k, parts);
  int64_t per_part = pack_a_floats(g.m, g.k) + pack_b_floats(g.n, g.k);
  auto run_part = [&](int p) {
    int64_t i0 = (p / plan.pn) * plan.mp, j0 = (p % plan.pn) * plan.np;
    int64_t i1 = std::min(g.m, i0 + plan.mp), j1 = std::min(g.n, j0 + plan.np);
    if (i0 >= i1 || j0 >= j1) return;
    float* ap = scratch + p * per_part;
    gemm_block(g, i0, i1, j0, j1, ap, ap + pack_a_floats(g.m, g.k));
  };
  if (plan.pm * plan.pn == 1) run_part(0);
  else for_parts(plan.pm * plan.pn, run_part);
}

int64_t sgemm_packed_a_floats(int64_t m, int64_t k) { return round_up(m, kMR) * k; }

void sgemm_pack_a_parallel(int64_t m, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, float* dst) {
  if (m <= 0 || k <= 0) return;
  const int64_t panels = (m + kMR - 1) / kMR;  // panel i starts at dst + i * kMR * k
  parallel_for(panels, std::max<int64_t>(1, (int64_t(1) << 16) / (kMR * k)), [&](int64_t lo, int64_t hi) {
    const int64_t i0 = lo * kMR, i1 = std::min(m, hi * kMR);
    pack_a(i1 - i0, k, a + i0 * a_rs, a_rs, a_cs, dst + i0 * k);
  });
}

int64_t sgemm_packed_b_floats(int64_t n, int64_t k) { return round_up(n, kNR) * k; }

void sgemm_pack_b(int64_t n, int64_t k, const float* b, int64_t b_rs, int64_t b_cs, float* dst) {
  if (n > 0 && k > 0) pack_b(k, n, b, b_rs, b_cs, dst);
}

void sgemm_pack_b_parallel(int64_t n, int64_t k, const float* b, int64_t b_rs, int64_t b_cs, float* dst) {
  if (n <= 0 || k <= 0) return;
  // Panels of kNR columns are independent (panel j starts at dst + j * kNR * k): large weights
  // are packed on every thread, since engines pack each weight when they are made or refitted.
  const int64_t panels = (n + kNR - 1) / kNR;
  parallel_for(panels, std::max<int64_t>(1, (int64_t(1) << 16) / (kNR * k)), [&](int64_t lo, int64_t hi) {
    const int64_t j0 = lo * kNR, j1 = std::min(n, hi * kNR);
    pack_b(k, j1 - j0, b + j0 * b_cs, b_rs, b_cs, dst + j0 * k);
  });
}

// ---- shared pieces ------------------------------------------------------------------------

F32Input::F32Input(const Graph& g, ValueId id) {
  if (id == kNoValue) return;
  const Value& v = g.value(id);
  present_ = true;
  dtype_ = v.type.dtype;
  numel_ = v.type.numel();
  if (dtype_ != DType::kF32 && v.is_constant()) {
    auto data = std::make_shared<std::vector<float>>(size_t(numel_));
    to_f32(v.data->data(), dtype_, data->data(), numel_);
    constant_ = std::move(data);
  }
}

const float* F32Input::get(const void* p, float* scratch) const {
  if (!present_) return nullptr;
  if (dtype_ == DType::kF32) return static_cast<const float*>(p);
  if (constant_) return constant_->data();
  to_f32_parallel(p, dtype_, scratch, numel_);
  return scratch;
}

namespace {
constexpr int64_t kConvertGrain = 1 << 16;
}

void to_f32_parallel(const void* src, DType t, float* dst, int64_t n) {
  size_t es = dtype_size(t);
  parallel_for(n, kConvertGrain, [&](int64_t b, int64_t e) {
    to_f32(static_cast<const char*>(src) + b * es, t, dst + b, e - b);
  });
}

void from_f32_parallel(const float* src, DType t, void* dst, int64_t n) {
  size_t es = dtype_size(t);
  parallel_for(n, kConvertGrain, [&](int64_t b, int64_t e) {
    from_f32(src + b, t, static_cast<char*>(dst) + b * es, e - b);
  });
}

namespace {

// Offsets of the batch matrices (row-major over out_batch) of an operand that steps `step`
// elements per output batch dim (0 where it broadcasts) from `offset`.
std::vector<int64_t> strided_batch_offsets(const std::vector<int64_t>& out_batch, const std::vector<int64_t>& step,
                                           int64_t offset) {
  int64_t count = 1;
  for (int64_t e : out_batch) count *= e;
  std::vector<int64_t> offs(size_t(count), 0);
  std::vector<int64_t> idx(out_batch.size(), 0);
  for (int64_t b = 0; b < count; ++b) {
    int64_t off = offset;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * step[d];
    offs[size_t(b)] = off;
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < out_batch[d]) break;
      idx[d] = 0;
    }
  }
  return offs;
}

}  // namespace

std::vector<int64_t> batch_offsets(const std::vector<int64_t>& out_batch, const std::vector<int64_t>& batch,
                                   int64_t matrix_size) {
  std::vector<int64_t> step(out_batch.size(), 0);
  int64_t s = matrix_size;
  for (size_t i = batch.size(); i-- > 0;) {
    step[i + out_batch.size() - batch.size()] = batch[i] == 1 ? 0 : s;
    s *= batch[i];
  }
  return strided_batch_offsets(out_batch, step, 0);
}

StridedOperand strided_operand(const std::vector<int64_t>& out_batch, const OperandView& v) {
  const std::vector<int64_t> shape = v.logical.shape();
  const size_t r = shape.size();
  StridedOperand o;
  o.offsets = strided_batch_offsets(out_batch, matmul_batch_strides(out_batch, v), v.offset);
  o.rs = v.strides[r - 2], o.cs = v.strides[r - 1];
  return o;
}

void for_parts(int parts, const std::function<void(int)>& fn) {
  if (parts <= 1) {
    if (parts == 1) fn(0);
    return;
  }
  parallel_for(parts, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) fn(static_cast<int>(p));
  });
}

}  // namespace kiln::cpu
