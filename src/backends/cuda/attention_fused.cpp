// sdpa geometry (batch strides of q, k, v and the mask over the output's batch dims) and the
// fused flash-attention path: one generated kernel (flash_codegen.cpp) per dtype, head dim and
// mask kind, a block of 64 query rows per CTA walking the keys in blocks of 64 with an online
// softmax, so the scores never reach memory. Every operand is addressed by its batch strides
// and row stride (AttentionGeometry), so layout "bshd" ([B, S, H, D]) needs no copy.
//
// State: pack_state(cubin, params): params = kFusedTag. run() checks the 16-byte alignment of
// q, k, v and the output that the kernel's vector loads need (kInvalidArgument when not).
#include <cmath>

#include "src/backends/cuda/attention_fused.h"
#include "src/backends/cuda/cuda_util.h"
#include "src/ops/shape_rules.h"

namespace kiln::cuda {

namespace {

constexpr uint8_t kFusedTag = 2;

// Strides of an operand with batch dims `batch` (right-aligned) over `out` (0 where broadcast).
void batch_strides(const std::vector<int64_t>& out, const std::vector<int64_t>& batch, int64_t matrix, KilnDims& d) {
  int64_t st = matrix;
  for (size_t i = 0; i < out.size() && i < size_t(kKilnMaxDims); ++i) d.size[i] = out[i], d.stride[i] = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const size_t od = out.size() - 1 - i, bd = batch.size() - 1 - i;
    if (od < size_t(kKilnMaxDims)) d.stride[od] = batch[bd] == 1 ? 0 : st;
    st *= batch[bd];
  }
}

// The batch strides over (B, H) of a bshd operand whose [B', H', S, D] view is `s` (0 where
// B' or H' is 1 and broadcasts); returns its row stride H' * D.
int64_t bshd_strides(const std::vector<int64_t>& out, const std::vector<int64_t>& s, KilnDims& d) {
  for (size_t i = 0; i < 2; ++i) d.size[i] = out[i];
  d.stride[0] = s[0] == 1 ? 0 : s[1] * s[2] * s[3];
  d.stride[1] = s[1] == 1 ? 0 : s[3];
  return s[1] * s[3];
}

class FusedKernel final : public Kernel {
 public:
  AttentionGeometry geo;
  std::shared_ptr<const Module> module;
  cudaKernel_t fn = nullptr;
  std::string desc;

  void run(const void* const* in, void* const* out, const RunContext& rc) const override {
    const uintptr_t bits = uintptr_t(in[0]) | uintptr_t(in[1]) | uintptr_t(in[2]) | uintptr_t(out[0]);
    KILN_CHECK(bits % 16 == 0, kInvalidArgument, "sdpa (fused): q, k, v and the output must be 16-byte aligned");
    const void *q = in[0], *k = in[1], *v = in[2], *mask = geo.mask_kind ? in[3] : nullptr;
    void* o = out[0];
    int L = int(geo.L), S = int(geo.S), causal = geo.causal ? 1 : 0, brank = geo.batch_rank;
    float scale_log2 = geo.scale * 1.4426950408889634f;
    KilnDims qd = geo.q_dims, kd = geo.k_dims, vd = geo.v_dims, od = geo.o_dims, md = geo.mask_dims;
    long long mrs = geo.mask_row_stride, mcs = geo.mask_col_stride;
    long long qr = geo.q_row, kr = geo.k_row, vr = geo.v_row, orow = geo.o_row;
    void* args[] = {&q,  &k,  &v,  &o,  &mask,  &L,  &S,     &scale_log2, &causal, &qd, &kd,
                    &vd, &od, &md, &brank, &mrs, &mcs, &qr, &kr,         &vr,     &orow};
    const dim3 grid(unsigned((geo.L + kFlashBlockM - 1) / kFlashBlockM), unsigned(geo.batch_count));
    launch(fn, grid, dim3(kFlashThreads), args, 0, stream_of(rc));
  }
  std::string describe() const override { return desc; }
  Bytes state() const override { return pack_state(module->cubin(), Bytes{kFusedTag}); }
};

}  // namespace

AttentionGeometry attention_geometry(const Node& n, const Graph& g) {
  AttentionGeometry geo;
  geo.bshd = sdpa_bshd(n.attrs);
  // Shapes in the default order [..., H, S, D]; bshd operands are [B, S, H, D] in memory.
  auto view = [&](ValueId v) { return (geo.bshd ? swap_seq_heads(g.type(v)) : g.type(v)).shape(); };
  const auto qs = view(n.inputs[0]), ks = view(n.inputs[1]), vs = view(n.inputs[2]), ys = view(n.outputs[0]);
  geo.dtype = g.type(n.inputs[0]).dtype;
  geo.L = qs[qs.size() - 2], geo.E = qs.back(), geo.S = ks[ks.size() - 2], geo.Ev = vs.back();
  geo.causal = n.attrs.get_bool("causal", false);
  geo.scale = float(n.attrs.get_float("scale", 1.0 / std::sqrt(double(std::max<int64_t>(geo.E, 1)))));
  auto batch = [](const std::vector<int64_t>& s) { return std::vector<int64_t>(s.begin(), s.end() - 2); };
  geo.out_batch = batch(ys), geo.q_batch = batch(qs), geo.k_batch = batch(ks), geo.v_batch = batch(vs);
  geo.batch_rank = int(geo.out_batch.size());
  for (int64_t d : geo.out_batch) geo.batch_count *= d;
  if (!geo.bshd) {
    batch_strides(geo.out_batch, geo.q_batch, geo.L * geo.E, geo.q_dims);
    batch_strides(geo.out_batch, geo.k_batch, geo.S * geo.E, geo.k_dims);
    batch_strides(geo.out_batch, geo.v_batch, geo.S * geo.Ev, geo.v_dims);
    batch_strides(geo.out_batch, geo.out_batch, geo.L * geo.Ev, geo.o_dims);
    geo.q_row = geo.k_row = geo.E, geo.v_row = geo.o_row = geo.Ev;
  } else {
    geo.q_row = bshd_strides(geo.out_batch, qs, geo.q_dims);
    geo.k_row = bshd_strides(geo.out_batch, ks, geo.k_dims);
    geo.v_row = bshd_strides(geo.out_batch, vs, geo.v_dims);
    geo.o_row = bshd_strides(geo.out_batch, ys, geo.o_dims);
  }
  const ValueId mask = n.inputs.size() > 3 ? n.inputs[3] : kNoValue;
  if (mask != kNoValue) {
    geo.mask_kind = g.type(mask).dtype == DType::kBool ? 1 : 2;
    auto ms = g.type(mask).shape();
    while (ms.size() < 2) ms.insert(ms.begin(), 1);
    const int64_t Lm = ms[ms.size() - 2], Sm = ms.back();
    geo.mask_row_stride = Lm == 1 ? 0 : Sm;
    geo.mask_col_stride = Sm == 1 ? 0 : 1;
    batch_strides(geo.out_batch, batch(ms), Lm * Sm, geo.mask_dims);
  }
  return geo;
}

bool fused_attention_serves(const AttentionGeometry& geo, std::string* why) {
  auto no = [&](const std::string& r) {
    if (why) *why = r;
    return false;
  };
  if (geo.dtype != DType::kF16 && geo.dtype != DType::kBF16)
    return no(std::string("the fused kernel takes f16/bf16, not ") + dtype_name(geo.dtype));
  if (geo.E != geo.Ev || (geo.E != 64 && geo.E != 128))
    return no("the fused kernel needs q, k and v head dims of 64 or 128 (got " + std::to_string(geo.E) + ", " +
              std::to_string(geo.Ev) + ")");
  if (geo.batch_count > 65535) return no("more than 65535 batch matrices");
  if (geo.batch_rank > kKilnMaxDims) return no("more than 8 batch dims");
  return true;
}

std::unique_ptr<Kernel> make_fused_attention(const Node& n, const AttentionGeometry& geo, const CompiledState* saved) {
  std::string why;
  if (!fused_attention_serves(geo, &why))
    throw Error(saved ? ErrorCode::kCorrupted : ErrorCode::kInternal,
                "sdpa node '" + n.name + "': the fused kernel cannot serve it: " + why);
  auto k = std::make_unique<FusedKernel>();
  k->geo = geo;
  if (saved) {
    KILN_CHECK(saved->params.size() == 1 && saved->params[0] == kFusedTag, kCorrupted, "sdpa state of node '",
               n.name, "' is malformed");
    k->module = Module::load(saved->cubin);
  } else {
    k->module = Module::compile(flash_attention_source(geo.dtype, int(geo.E), geo.mask_kind),
                                "fused attention of node '" + n.name + "'");
  }
  k->fn = k->module->kernel("kiln_flash_attention");
  static const char* kMasks[] = {"", ", bool mask", ", additive mask"};
  k->desc = "sdpa fused flash attention (generated, mma.sync f16/bf16, head dim " + std::to_string(geo.E) + ", " +
            std::to_string(geo.batch_count) + " x " + std::to_string(geo.L) + " x " + std::to_string(geo.S) +
            (geo.causal ? ", causal" : "") + kMasks[geo.mask_kind] + (geo.bshd ? ", bshd strided" : "") + ")";
  return k;
}

}  // namespace kiln::cuda
