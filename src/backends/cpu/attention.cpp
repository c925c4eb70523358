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
// Any other form (layout "bshd", operand views q_view / k_view / v_view, out_perm; see
// src/ops/attention.cpp) runs this kernel on dense copies: sdpa_layout describes each operand as
// a strided view of its buffer, each view that is not already its logical tensor is gathered
// into the workspace, and a permuted output is scattered from a logical one. The mask needs no
// copy (it indexes the logical scores). Correct, not fast: the copies are what the CUDA kernels,
// which read the strides directly, avoid.
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "src/backends/cpu/gemm.h"
#include "src/backends/cpu/kernels.h"
#include "src/ops/access.h"
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

// dst = src over `sizes`, elements of `es` bytes addressed by element strides on either side;
// the last dim is contiguous on both sides, so each row is one memcpy.
void copy_rows(const char* src, const std::vector<int64_t>& src_st, char* dst, const std::vector<int64_t>& dst_st,
               const std::vector<int64_t>& sizes, size_t es) {
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < sizes.size(); ++d) rows *= sizes[d];
  const int64_t cols = sizes.back();
  if (rows * cols == 0) return;
  parallel_for(rows, std::max<int64_t>(1, 4096 / cols), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      int64_t rest = r, so = 0, d_off = 0;
      for (size_t d = sizes.size() - 1; d-- > 0;) {
        const int64_t i = rest % sizes[d];
        rest /= sizes[d];
        so += i * src_st[d], d_off += i * dst_st[d];
      }
      std::memcpy(dst + size_t(d_off) * es, src + size_t(so) * es, size_t(cols) * es);
    }
  });
}

// The node in its strided form: the default-layout kernel on logical copies (see the header).
std::unique_ptr<Kernel> make_strided_attention(const Node& n, const Graph& g, const SdpaLayout& lay) {
  auto inner = std::make_shared<Graph>();
  const SdpaView* views[4] = {&lay.q, &lay.k, &lay.v, &lay.out};
  std::vector<ValueId> ins;
  for (size_t i = 0; i < 3; ++i) ins.push_back(inner->add_input("in" + std::to_string(i), views[i]->logical));
  if (n.inputs.size() > 3 && n.inputs[3] != kNoValue) ins.push_back(inner->add_input("mask", g.type(n.inputs[3])));
  Attrs attrs = n.attrs;
  for (const char* key : {"layout", "q_view", "k_view", "v_view", "out_perm"}) attrs.erase(key);
  inner->add_node(OpKind::kSdpa, ins, attrs, n.name);
  std::shared_ptr<const Kernel> first = make_attention_kernel(*inner->nodes().back(), *inner);

  struct Copy {
    bool needed = false;
    size_t at = 0;                       // workspace offset of the logical tensor
    int64_t offset = 0;                  // elements into the node's buffer
    std::vector<int64_t> sizes, strides, dense;
  };
  std::array<Copy, 4> copies;  // q, k, v gathered; the output scattered
  size_t used = 0;
  const size_t es = dtype_size(lay.q.logical.dtype);
  for (size_t i = 0; i < 4; ++i) {
    Copy& c = copies[i];
    c.needed = !views[i]->dense();
    if (!c.needed) continue;
    c.offset = views[i]->offset, c.sizes = views[i]->logical.shape(), c.strides = views[i]->strides;
    c.dense = row_major_strides(c.sizes);
    c.at = used;
    used += (views[i]->logical.nbytes() + 63) / 64 * 64;
  }
  const size_t inner_at = used, ws = used + first->workspace_size();
  const std::string what = "sdpa (node '" + n.name + "', strided operands)";

  auto fn = [=](const void* const* in, void* const* outs, const RunContext& ctx) {
    (void)inner;  // keeps the graph the default-layout kernel was made from
    check_workspace(ctx, ws, what.c_str());
    char* base = static_cast<char*>(ctx.workspace);
    std::vector<const void*> args(in, in + ins.size());
    for (size_t i = 0; i < 3; ++i) {
      const Copy& c = copies[i];
      if (!c.needed) continue;
      copy_rows(static_cast<const char*>(in[i]) + size_t(c.offset) * es, c.strides, base + c.at, c.dense, c.sizes, es);
      args[i] = base + c.at;
    }
    void* y = copies[3].needed ? static_cast<void*>(base + copies[3].at) : outs[0];
    RunContext inner_ctx = ctx;
    inner_ctx.workspace = base + inner_at;
    inner_ctx.workspace_size = ws - inner_at;
    first->run(args.data(), &y, inner_ctx);
    const Copy& o = copies[3];
    if (o.needed) copy_rows(static_cast<const char*>(y), o.dense, static_cast<char*>(outs[0]), o.strides, o.sizes, es);
  };
  return make_fn_kernel(fn, first->describe() + " (" + what + " through dense copies)", ws);
}

}  // namespace

std::unique_ptr<Kernel> make_attention_kernel(const Node& n, const Graph& g) {
  KILN_CHECK(n.op == OpKind::kSdpa, kInternal, op_name(n.op), " is not in the attention family");
  {
    TypeList types;
    for (ValueId v : n.inputs) types.push_back(v == kNoValue ? nullptr : &g.type(v));
    const SdpaLayout lay = sdpa_layout(types, n.attrs);
    bool plain = true;
    const SdpaView* views[3] = {&lay.q, &lay.k, &lay.v};
    for (size_t i = 0; i < 3; ++i) plain = plain && views[i]->dense() && views[i]->logical.shape() == types[i]->shape();
    for (size_t j = 0; j < lay.out_perm.size(); ++j) plain = plain && lay.out_perm[j] == int64_t(j);
    if (!plain) return make_strided_attention(n, g, lay);
  }
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
