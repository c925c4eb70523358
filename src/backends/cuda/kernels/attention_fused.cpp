// sdpa geometry (batch strides of q, k, v and the mask over the output's batch dims) and the
// fused flash-attention path: one generated kernel (flash_attention_source.cpp) per dtype, head dim and
// mask kind, a block of 64 query rows per CTA walking the keys in blocks of 64 with an online
// softmax, so the scores never reach memory. Every operand is addressed by an element offset,
// its batch strides and its row stride (AttentionGeometry), taken from sdpa_layout: layout
// "bshd" ([B, S, H, D]), operand views (q_view, ...: q, k and v read straight out of a qkv
// linear's output) and a permuted output (out_perm) all need no copy. The offsets are added to
// the pointers on the host, so the kernel source is the same for every form.
//
// State: pack_state(cubin, params): params = kFusedTag. The kernel's 16-byte vector loads need
// every offset and stride but the head dim's to be a multiple of 16 bytes (checked when the
// kernel is chosen: fused_attention_serves) and the pointers 16-byte aligned (checked by run(),
// kInvalidArgument when not).
#include <cmath>

#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/kernels/attention_fused.h"
#include "src/ops/shape_rules.h"

namespace kiln::cuda {

namespace {

constexpr uint8_t kFusedTag = 2;

// Strides of the mask with batch dims `batch` (right-aligned) over `out` (0 where broadcast).
void batch_strides(const std::vector<int64_t>& out, const std::vector<int64_t>& batch, int64_t matrix, KilnDims& d) {
  int64_t st = matrix;
  for (size_t i = 0; i < out.size() && i < size_t(kKilnMaxDims); ++i) d.size[i] = out[i], d.stride[i] = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const size_t od = out.size() - 1 - i, bd = batch.size() - 1 - i;
    if (od < size_t(kKilnMaxDims)) d.stride[od] = batch[bd] == 1 ? 0 : st;
    st *= batch[bd];
  }
}

// An operand's batch strides over the output's batch dims `out` (its own batch dims right-
// aligned; 0 where its dim is 1 and broadcasts); returns its row stride. A single row gets the
// row stride of a dense one (the head dim), which GEMM leading dims accept.
int64_t view_strides(const std::vector<int64_t>& out, const SdpaView& v, KilnDims& d) {
  const std::vector<int64_t> s = v.logical.shape();
  const size_t batch = s.size() - 2;
  for (size_t i = 0; i < out.size() && i < size_t(kKilnMaxDims); ++i) d.size[i] = out[i], d.stride[i] = 0;
  for (size_t i = 0; i < batch && i < out.size(); ++i) {
    const size_t od = out.size() - 1 - i, bd = batch - 1 - i;
    if (od < size_t(kKilnMaxDims)) d.stride[od] = s[bd] == 1 ? 0 : v.strides[bd];
  }
  return s[batch] == 1 ? s.back() : v.strides[batch];
}

class FusedKernel final : public Kernel {
 public:
  AttentionGeometry geo;
  std::shared_ptr<const Module> module;
  cudaKernel_t fn = nullptr;
  std::string desc;

  void run(const void* const* in, void* const* out, const RunContext& rc) const override {
    const size_t es = dtype_size(geo.dtype);
    const void* q = static_cast<const char*>(in[0]) + size_t(geo.q_off) * es;
    const void* k = static_cast<const char*>(in[1]) + size_t(geo.k_off) * es;
    const void* v = static_cast<const char*>(in[2]) + size_t(geo.v_off) * es;
    const void* mask = geo.mask_kind ? in[3] : nullptr;
    void* o = static_cast<char*>(out[0]) + size_t(geo.o_off) * es;
    const uintptr_t bits = uintptr_t(q) | uintptr_t(k) | uintptr_t(v) | uintptr_t(o);
    KILN_CHECK(bits % 16 == 0, kInvalidArgument, "sdpa (fused): q, k, v and the output must be 16-byte aligned");
    int L = int(geo.L), S = int(geo.S), causal = geo.causal ? 1 : 0, brank = geo.batch_rank;
    float scale_log2 = geo.scale * 1.4426950408889634f;
    KilnDims qd = geo.q_dims, kd = geo.k_dims, vd = geo.v_dims, od = geo.o_dims, md = geo.mask_dims;
    long long mrs = geo.mask_row_stride, mcs = geo.mask_col_stride;
    long long qr = geo.q_row, kr = geo.k_row, vr = geo.v_row, orow = geo.o_row;
    void* args[] = {&q,  &k,  &v,  &o,     &mask, &L,   &S,  &scale_log2, &causal, &qd,  &kd,
                    &vd, &od, &md, &brank, &mrs,  &mcs, &qr, &kr,         &vr,     &orow};
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
  geo.views = n.attrs.has("q_view") || n.attrs.has("k_view") || n.attrs.has("v_view") || n.attrs.has("out_perm");
  // Every form as strided views of the buffers over the default order [..., H, S, D].
  TypeList types;
  for (ValueId v : n.inputs) types.push_back(v == kNoValue ? nullptr : &g.type(v));
  const SdpaLayout lay = sdpa_layout(types, n.attrs);
  const auto qs = lay.q.logical.shape(), ks = lay.k.logical.shape(), vs = lay.v.logical.shape();
  const auto ys = lay.out.logical.shape();
  geo.dtype = g.type(n.inputs[0]).dtype;
  geo.L = qs[qs.size() - 2], geo.E = qs.back(), geo.S = ks[ks.size() - 2], geo.Ev = vs.back();
  geo.causal = n.attrs.get_bool("causal", false);
  geo.scale = float(n.attrs.get_float("scale", 1.0 / std::sqrt(double(std::max<int64_t>(geo.E, 1)))));
  auto batch = [](const std::vector<int64_t>& s) { return std::vector<int64_t>(s.begin(), s.end() - 2); };
  geo.out_batch = batch(ys), geo.q_batch = batch(qs), geo.k_batch = batch(ks), geo.v_batch = batch(vs);
  geo.batch_rank = int(geo.out_batch.size());
  for (int64_t d : geo.out_batch) geo.batch_count *= d;
  geo.q_row = view_strides(geo.out_batch, lay.q, geo.q_dims);
  geo.k_row = view_strides(geo.out_batch, lay.k, geo.k_dims);
  geo.v_row = view_strides(geo.out_batch, lay.v, geo.v_dims);
  geo.o_row = view_strides(geo.out_batch, lay.out, geo.o_dims);
  geo.q_off = lay.q.offset, geo.k_off = lay.k.offset, geo.v_off = lay.v.offset, geo.o_off = lay.out.offset;
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
  if (geo.E != geo.Ev || !flash_attention_head_dim(geo.E))
    return no("the fused kernel needs equal q, k and v head dims of 32, 64, 96 or 128 (got " + std::to_string(geo.E) +
              ", " + std::to_string(geo.Ev) + ")");
  if (geo.batch_count > 65535) return no("more than 65535 batch matrices");
  if (geo.batch_rank > kKilnMaxDims) return no("more than 8 batch dims");
  // 16-byte vector loads and stores from every row of every batch matrix.
  const int64_t es = int64_t(dtype_size(geo.dtype));
  auto aligned = [&](int64_t off, const KilnDims& d, int64_t row) {
    bool ok = (off * es) % 16 == 0 && (row * es) % 16 == 0;
    for (int i = 0; i < geo.batch_rank; ++i) ok = ok && (d.stride[i] * es) % 16 == 0;
    return ok;
  };
  if (!aligned(geo.q_off, geo.q_dims, geo.q_row) || !aligned(geo.k_off, geo.k_dims, geo.k_row) ||
      !aligned(geo.v_off, geo.v_dims, geo.v_row) || !aligned(geo.o_off, geo.o_dims, geo.o_row))
    return no("an operand offset or stride that is not a multiple of 16 bytes");
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
    KILN_CHECK(saved->params.size() == 1 && saved->params[0] == kFusedTag, kCorrupted, "sdpa state of node '", n.name,
               "' is malformed");
    k->module = Module::load(saved->cubin);
  } else {
    k->module = Module::compile(flash_attention_source(geo.dtype, int(geo.E), geo.mask_kind),
                                "fused attention of node '" + n.name + "'");
  }
  k->fn = k->module->kernel("kiln_flash_attention");
  static const char* kMasks[] = {"", ", bool mask", ", additive mask"};
  k->desc = "sdpa fused flash attention (generated, mma.sync f16/bf16, head dim " + std::to_string(geo.E) + ", " +
            std::to_string(geo.batch_count) + " x " + std::to_string(geo.L) + " x " + std::to_string(geo.S) +
            (geo.causal ? ", causal" : "") + kMasks[geo.mask_kind] + (geo.bshd ? ", bshd strided" : "") +
            (geo.views ? ", strided views" : "") + ")";
  return k;
}

}  // namespace kiln::cuda
