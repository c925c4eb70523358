// CPU kernel of sdpa: per batch index and block of query rows,
//   scores = scale * q k^T (sgemm) -> + float mask / -inf where the bool mask is false or
//   causal (key j > query i, top-left aligned as PyTorch's is_causal) -> softmax -> @ v (sgemm).
//
// Row blocks bound the scores buffer (rows x S floats per thread) and spread the work over
// threads; with causal, a block only computes the keys its last row can see. Batch dims of
// q, k, v and mask broadcast through precomputed per-batch offsets.
//
// A fully masked row (every score -inf) gives zeros, as PyTorch's math backend does since it
// switched to a "safe" softmax (older versions gave NaN). exp is a vectorizable polynomial
// (relative error < 1e-7) so the softmax does not dominate at small head dims.
//
// layout "bshd" (q, k, v, out [B, S, H, D]) runs this kernel between permutes of q, k, v and
// the output (layout.cpp's make_relayout); the mask needs none (it indexes the scores).
#include <bit>
#include <cmath>
#include <limits>

#include "src/backends/cpu/gemm.h"
#include "src/backends/cpu/kernels.h"
#include "src/ops/shape_rules.h"

namespace kiln::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// e^x for x <= 0 (scores minus their row max); 0 below float's range, NaN kept. Branch-free
// and without float-to-int conversions, so the loop calling it vectorizes.
inline float exp_nonpositive(float x) {
  float xc = x >= -87.0f ? x : -87.0f;
  xc = xc <= 88.0f ? xc : 88.0f;
  constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = xc * 1.44269504088896341f + kShifter;
  const float n = t - kShifter;                                 // round(x / ln 2)
  const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;  // ln 2 split in two for accuracy
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kShifter) + 127) << 23;  // 2^n
  const float e = p * std::bit_cast<float>(bits);
  return x != x ? x : (x < -87.0f ? 0.0f : e);
}

// In place softmax of row[0, n); a row of all -inf becomes zeros.
void softmax_row(float* row, int64_t n) {
  constexpr int kLanes = 16;  // independent partial results, so the reductions vectorize
  float mx[kLanes], sm[kLanes];
  std::fill(mx, mx + kLanes, kNegInf);
  std::fill(sm, sm + kLanes, 0.0f);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) mx[l] = row[j + l] > mx[l] ? row[j + l] : mx[l];
  float m = kNegInf;
  for (int l = 0; l < kLanes; ++l) m = mx[l] > m ? mx[l] : m;
  for (; j < n; ++j) m = row[j] > m ? row[j] : m;
  if (m == kNegInf) {
    std::fill(row, row + n, 0.0f);
    return;
  }
  for (j = 0; j < n; ++j) row[j] = exp_nonpositive(row[j] - m);
  for (j = 0; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) sm[l] += row[j + l];
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += sm[l];
  for (; j < n; ++j) s += row[j];
  const float inv = 1.0f / s;
  for (j = 0; j < n; ++j) row[j] *= inv;
}

}  // namespace

std::unique_ptr<Kernel> make_attention_kernel(const Node& n, const Graph& g) {
  KILN_CHECK(n.op == OpKind::kSdpa, kInternal, op_name(n.op), " is not in the attention family");
  if (sdpa_bshd(n.attrs)) return make_relayout(n, g, {0, 1, 2}, {0, 2, 1, 3}, &make_attention_kernel);
  const auto qs = g.type(n.inputs[0]).shape(), ks = g.type(n.inputs[1]).shape(), vs = g.type(n.inputs[2]).shape();
  const auto ys = g.type(n.outputs[0]).shape();
  const DType dt = g.type(n.inputs[0]).dtype;
  const int64_t L = qs[qs.size() - 2], E = qs.back(), S = ks[ks.size() - 2], Ev = vs.back();
  const std::vector<int64_t> out_batch(ys.begin(), ys.end() - 2);
  auto batch = [](const std::vector<int64_t>& s) { return std::vector<int64_t>(s.begin(), s.end() - 2); };
  auto q_off = std::make_shared<const std::vector<int64_t>>(batch_offsets(out_batch, batch(qs), L * E));
  auto k_off = std::make_shared<const std::vector<int64_t>>(batch_offsets(out_batch, batch(ks), S * E));
  auto v_off = std::make_shared<const std::vector<int64_t>>(batch_offsets(out_batch, batch(vs), S * Ev));
  const int64_t batches = static_cast<int64_t>(q_off->size());

  const ValueId mask_id = n.inputs.size() > 3 ? n.inputs[3] : kNoValue;
  const bool has_mask = mask_id != kNoValue;
  const bool bool_mask = has_mask && g.type(mask_id).dtype == DType::kBool;
  int64_t mrs = 0, mcs = 0;  // the mask's row and column strides within one [L, S] block
  std::shared_ptr<const std::vector<int64_t>> m_off;
  if (has_mask) {
    auto ms = g.type(mask_id).shape();
    while (ms.size() < 2) ms.insert(ms.begin(), 1);
    const int64_t Lm = ms[ms.size() - 2], Sm = ms.back();
    mrs = Lm == 1 ? 0 : Sm;
    mcs = Sm == 1 ? 0 : 1;
    m_off = std::make_shared<const std::vector<int64_t>>(batch_offsets(out_batch, batch(ms), Lm * Sm));
  }
  const bool causal = n.attrs.get_bool("causal", false);
  const float scale = static_cast<float>(n.attrs.get_float("scale", 1.0 / std::sqrt(double(std::max<int64_t>(E, 1)))));

  const int64_t block = std::min(L, std::clamp<int64_t>(65536 / std::max<int64_t>(S, 1), 16, 256));
  const int64_t nblocks = block > 0 ? (L + block - 1) / block : 0;
  const int64_t tasks = batches * nblocks;
  const int threads = num_threads();
  const int parts = tasks >= threads ? threads : 1;  // else each GEMM is split over threads
  const int gemm_parts = parts == 1 ? threads : 1;
  // Per part: the scores block, k packed for sgemm once per batch index (row blocks of one
  // batch run back to back in a part), and sgemm's own scratch.
  const int64_t scores_floats = (block * S + 15) / 16 * 16;
  const bool pack_k = nblocks > 1 && block > kFewRows;
  const int64_t packed_floats = pack_k ? (sgemm_packed_b_floats(S, E) + 15) / 16 * 16 : 0;
  const int64_t per_part = scores_floats + packed_floats +
                           std::max(sgemm_scratch_floats(block, S, E, gemm_parts),
                                    sgemm_scratch_floats(block, Ev, S, gemm_parts));
  F32Input q(g, n.inputs[0]), k(g, n.inputs[1]), v(g, n.inputs[2]);
  F32Input fmask = has_mask && !bool_mask ? F32Input(g, mask_id) : F32Input();
  const int64_t y_numel = batches * L * Ev;
  Carver sizes;
  for (const F32Input* t : {&q, &k, &v, &fmask}) sizes.take(t->scratch_floats());
  sizes.take(dt == DType::kF32 ? 0 : y_numel);
  sizes.take(per_part * parts);
  const size_t ws = sizes.used();

  auto fn = [=](const void* const* in, void* const* out, const RunContext& ctx) {
    check_workspace(ctx, ws, "sdpa");
    Carver c(ctx.workspace);
    const float* Q = q.get(in[0], c.take(q.scratch_floats()));
    const float* K = k.get(in[1], c.take(k.scratch_floats()));
    const float* V = v.get(in[2], c.take(v.scratch_floats()));
    float* fm_scratch = c.take(fmask.scratch_floats());
    const float* FM = fmask.present() ? fmask.get(in[3], fm_scratch) : nullptr;
    const uint8_t* BM = bool_mask ? static_cast<const uint8_t*>(in[3]) : nullptr;
    float* ys_ = c.take(dt == DType::kF32 ? 0 : y_numel);
    float* Y = dt == DType::kF32 ? static_cast<float*>(out[0]) : ys_;
    float* scratch = c.take(per_part * parts);

    for_parts(parts, [&](int part) {
      float* sc = scratch + part * per_part;
      float* packed = sc + scores_floats;
      float* gs = packed + packed_floats;
      int64_t packed_batch = -1;
      for (int64_t t = tasks * part / parts; t < tasks * (part + 1) / parts; ++t) {
        const int64_t b = t / nblocks, r0 = (t % nblocks) * block, r1 = std::min(L, r0 + block), rows = r1 - r0;
        float* yb = Y + (b * L + r0) * Ev;
        const int64_t s_eff = causal ? std::min(S, r1) : S;  // keys any row of the block can see
        if (s_eff == 0) {
          std::fill(yb, yb + rows * Ev, 0.0f);
          continue;
        }
        GemmArgs sg = gemm_rowmajor(rows, s_eff, E, Q + (*q_off)[size_t(b)] + r0 * E, E, K + (*k_off)[size_t(b)], E,
                                    true, sc, s_eff);
        sg.alpha = scale;
        if (pack_k) {
          if (packed_batch != b) sgemm_pack_b(S, E, sg.b, sg.b_rs, sg.b_cs, packed);
          packed_batch = b;
          sg.packed_b = packed;
        }
        sgemm(sg, gs, gemm_parts);
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t qi = r0 + i, valid = causal ? std::min(s_eff, qi + 1) : s_eff;
          float* srow = sc + i * s_eff;
          if (FM) {
            const float* mrow = FM + (*m_off)[size_t(b)] + qi * mrs;
            if (mcs) {
              for (int64_t j = 0; j < valid; ++j) srow[j] += mrow[j];
            } else {
              for (int64_t j = 0; j < valid; ++j) srow[j] += mrow[0];
            }
          } else if (BM) {
            const uint8_t* mrow = BM + (*m_off)[size_t(b)] + qi * mrs;
            for (int64_t j = 0; j < valid; ++j) srow[j] = mrow[j * mcs] ? srow[j] : kNegInf;
          }
          softmax_row(srow, valid);
          std::fill(srow + valid, srow + s_eff, 0.0f);
        }
        GemmArgs og = gemm_rowmajor(rows, Ev, s_eff, sc, s_eff, V + (*v_off)[size_t(b)], Ev, false, yb, Ev);
        sgemm(og, gs, gemm_parts);
      }
    });
    if (dt != DType::kF32) from_f32_parallel(Y, dt, out[0], y_numel);
  };
  std::string desc = "cpu sdpa sgemm, " + std::to_string(tasks) + " row blocks of " + std::to_string(block);
  return make_fn_kernel(fn, desc, ws);
}

}  // namespace kiln::cpu
