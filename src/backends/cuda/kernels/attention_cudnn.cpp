// cuDNN's fused SDPA operation as a tactic of sdpa (attention_cudnn.h).
#include <array>
#include <cstring>
#include <deque>
#include <limits>

#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/kernels/attention_cudnn.h"
#include "src/backends/cuda/kernels/conv_state.h"

namespace kiln::cuda {

namespace {

constexpr int64_t kUidQ = 1, kUidK = 2, kUidV = 3, kUidO = 4, kUidScale = 5, kUidBias = 6, kUidLowest = 7;
constexpr int64_t kUidVirtual = 100;  // the masked graph's intermediates: 100, 101, ...
constexpr int kMinCudnn = 91300;  // the first cuDNN with CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR

// One operand of the geometry as cuDNN's [B, H, rows, cols] dims and strides.
struct Operand {
  std::vector<int64_t> dims, strides;
};

Operand operand(const AttentionGeometry& g, int which) {
  const KilnDims& d = which == 0 ? g.q_dims : which == 1 ? g.k_dims : which == 2 ? g.v_dims : g.o_dims;
  const int64_t rows = which == 0 || which == 3 ? g.L : g.S;
  const int64_t cols = which == 0 || which == 1 ? g.E : g.Ev;
  const int64_t row = which == 0 ? g.q_row : which == 1 ? g.k_row : which == 2 ? g.v_row : g.o_row;
  KILN_CHECK(g.batch_rank <= 2, kInternal, "cuDNN attention operand of ", g.batch_rank, " batch dims (at most 2)");
  Operand o;
  o.dims = {1, 1, rows, cols};
  o.strides = {0, 0, row, 1};
  // Batch dims right-aligned into (B, H).
  for (int i = 0; i < g.batch_rank; ++i) {
    const size_t at = size_t(2 - g.batch_rank + i);
    o.dims[at] = d.size[i];
    o.strides[at] = d.stride[i];
  }
  // A dim of extent 1 gets the stride of a dense layout (cuDNN wants positive strides).
  if (o.dims[1] == 1 || o.strides[1] == 0) o.strides[1] = rows * row;
  if (o.dims[0] == 1 || o.strides[0] == 0) o.strides[0] = o.dims[1] * o.strides[1];
  return o;
}

// The additive mask as cuDNN's bias [B or 1, H or 1, L, S]: a batch dim it broadcasts over has
// extent 1, a query row it broadcasts over stride 0 (a padding mask is [B, 1, 1, S]).
Operand bias_operand(const AttentionGeometry& g) {
  KILN_CHECK(g.batch_rank <= 2, kInternal, "cuDNN attention bias of ", g.batch_rank, " batch dims (at most 2)");
  const int64_t matrix = g.mask_row_stride ? g.L * g.S : g.S;  // the mask's elements per (b, h)
  Operand o;
  o.dims = {1, 1, g.L, g.S};
  o.strides = {matrix, matrix, g.mask_row_stride, 1};
  for (int i = 0; i < g.batch_rank; ++i) {
    const size_t at = size_t(2 - g.batch_rank + i);
    if (g.mask_dims.stride[i] == 0) continue;
    o.dims[at] = g.mask_dims.size[i];
    o.strides[at] = g.mask_dims.stride[i];
  }
  if (o.dims[0] == 1) o.strides[0] = o.dims[1] * o.strides[1];
  return o;
}

Desc tensor(int64_t uid, cudnnDataType_t dt, const Operand& o, const std::string& what) {
  return tensor_desc(uid, dt, o.dims, o.strides, false, what);
}

// The operation graph and the descriptors it was made from (they live as long as its plans; a
// deque, since operations hold pointers to the descriptors made before them).
struct SdpaGraph {
  std::deque<Desc> parts;
  Desc graph;
};

// Unmasked: cuDNN's one SDPA operation (9.13 and later).
SdpaGraph build_sdpa_op(const AttentionGeometry& g, cudnnHandle_t handle, const std::string& what) {
#if CUDNN_VERSION >= 91300
  SdpaGraph s;
  const cudnnDataType_t dt = cudnn_dtype(g.dtype);
  s.parts.push_back(tensor(kUidQ, dt, operand(g, 0), what + ": tensor q"));
  s.parts.push_back(tensor(kUidK, dt, operand(g, 1), what + ": tensor k"));
  s.parts.push_back(tensor(kUidV, dt, operand(g, 2), what + ": tensor v"));
  s.parts.push_back(tensor(kUidO, dt, operand(g, 3), what + ": tensor o"));
  s.parts.push_back(scalar_desc(kUidScale, what + ": scale"));
  Desc op(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, what + ": sdpa operation");
  op.set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, s.parts[0])
      .set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, s.parts[1])
      .set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, s.parts[2])
      .set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, s.parts[3])
      .set_desc(CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, s.parts[4])
      .finalize();
  s.parts.push_back(std::move(op));
  s.graph = Desc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what + ": operation graph");
  s.graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
      .set_descs(CUDNN_ATTR_OPERATIONGRAPH_OPS, {&s.parts.back()})
      .finalize();
  return s;
#else
  (void)g, (void)handle;
  KILN_FAIL(kUnsupported, what, ": Kiln was compiled against a cuDNN without the fused sdpa operation (< 9.13)");
#endif
}

// Causal masking of the scores `s` (top-left aligned, as sdpa's causal): y = row >= col ? s :
// lowest, with the row and column indices generated along the scores' axes 2 and 3 (int32), their
// comparison (bool) and a select against a by-value f32 scalar (kUidLowest). The four outputs are
// virtual tensors of the scores' shape; the operations go to `ops`. Returns y.
const Desc& causal_select(std::deque<Desc>& parts, std::vector<const Desc*>& ops, const Desc& s, const Desc& row,
                          const Desc& col, const Desc& keep, const Desc& y, const std::string& what) {
  auto op = [&](cudnnPointwiseMode_t mode, cudnnDataType_t prec, const Desc& x, const Desc* b, const Desc* t,
                const Desc& out, const char* name, int64_t axis) {
    Desc& pd = parts.emplace_back(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what + ": " + name + " (pointwise descriptor)");
    pd.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
        .set_dtype(CUDNN_ATTR_POINTWISE_MATH_PREC, prec);
    if (axis >= 0) pd.set_i64(CUDNN_ATTR_POINTWISE_AXIS, axis);
    pd.finalize();
    Desc& o = parts.emplace_back(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what + ": " + name);
    o.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pd)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, out);
    if (b) o.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t) o.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    o.finalize();
    ops.push_back(&o);
  };
  const Desc& lowest = parts.emplace_back(scalar_desc(kUidLowest, what + ": lowest score"));
  op(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, row, "row index", 2);
  op(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, col, "column index", 3);
  op(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, &col, nullptr, keep, "row >= column", -1);
  op(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, &lowest, &keep, y, "causal select", -1);
  return y;
}

// With an additive mask or causal: the chain of operations cuDNN's runtime fusion recognizes as
// one flash-attention kernel (the form cuDNN's own graph library gives a biased or causal sdpa):
//   s = (q k^T) * scale + bias          matmul, mul, add            [B, H, L, S] f32
//   s = row >= col ? s : lowest          (causal) two index generators, a compare, a select
//   m = max_j s; e = exp(s - m)          max reduction, sub, exp
//   z = sum_j e; stats = m + log z       add reduction, log, add     [B, H, L, 1] f32
//   p = e / z                            div                         q's dtype
//   o = p v                              matmul
// All but q, k, v, the bias, the scale and o are virtual; the stats are a dangling output the
// pattern includes.
SdpaGraph build_biased_chain(const AttentionGeometry& g, cudnnHandle_t handle, const std::string& what) {
  SdpaGraph s;
  const cudnnDataType_t dt = cudnn_dtype(g.dtype);
  const Operand qo = operand(g, 0), ko = operand(g, 1), vo = operand(g, 2), oo = operand(g, 3);
  const int64_t B = oo.dims[0], H = oo.dims[1], L = g.L, S = g.S;
  const std::vector<int64_t> scores = {B, H, L, S}, scores_strides = {H * L * S, L * S, S, 1};
  const std::vector<int64_t> rows = {B, H, L, 1}, rows_strides = {H * L, L, 1, 1};
  std::vector<const Desc*> ops;
  int64_t next_uid = kUidVirtual;
  auto keep = [&](Desc d) -> Desc& { return s.parts.emplace_back(std::move(d)); };
  auto virt = [&](bool row, cudnnDataType_t t = CUDNN_DATA_FLOAT) -> const Desc& {
    const int64_t uid = next_uid++;
    return keep(tensor_desc(uid, t, row ? rows : scores, row ? rows_strides : scores_strides, true,
                            what + ": virtual tensor " + std::to_string(uid)));
  };
  auto matmul = [&](const Desc& a, const Desc& b, const Desc& c, const char* name) {
    Desc& md = keep(Desc(CUDNN_BACKEND_MATMUL_DESCRIPTOR, what + ": " + name + " descriptor"));
    md.set_dtype(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT).finalize();
    Desc& op = keep(Desc(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what + ": " + name));
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
        .set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, md)
        .finalize();
    ops.push_back(&op);
  };
  auto pointwise = [&](cudnnPointwiseMode_t pm, const Desc& x, const Desc* b, const Desc& y, const char* name) {
    ops.push_back(&pointwise_op(s.parts, pm, x, b, y, what + ": " + name));
    return &y;
  };
  auto reduce = [&](cudnnReduceTensorOp_t mode, const Desc& x, const Desc& y, const char* name) {
    Desc& rd = keep(Desc(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what + ": " + name + " descriptor"));
    rd.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode)
        .set_dtype(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT)
        .finalize();
    Desc& op = keep(Desc(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what + ": " + name));
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
        .set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd)
        .finalize();
    ops.push_back(&op);
    return &y;
  };

  // k^T: k's [B, H, S, E] with the last two dims (and their strides) swapped; no copy.
  Operand kt = ko;
  std::swap(kt.dims[2], kt.dims[3]);
  std::swap(kt.strides[2], kt.strides[3]);
  const Desc& q = keep(tensor(kUidQ, dt, qo, what + ": tensor q"));
  const Desc& k = keep(tensor(kUidK, dt, kt, what + ": tensor k^T"));
  const Desc& v = keep(tensor(kUidV, dt, vo, what + ": tensor v"));
  const Desc& o = keep(tensor(kUidO, dt, oo, what + ": tensor o"));
  const Desc& scale = keep(scalar_desc(kUidScale, what + ": scale"));

  const Desc& qk = virt(false);
  matmul(q, k, qk, "q k^T");
  const Desc* sc = pointwise(CUDNN_POINTWISE_MUL, qk, &scale, virt(false), "* scale");
  if (g.mask_kind == 2) {
    const Desc& bias = keep(tensor(kUidBias, dt, bias_operand(g), what + ": tensor bias (the mask)"));
    sc = pointwise(CUDNN_POINTWISE_ADD, *sc, &bias, virt(false), "+ bias");
  }
  if (g.causal)
    sc = &causal_select(s.parts, ops, *sc, virt(false, CUDNN_DATA_INT32), virt(false, CUDNN_DATA_INT32),
                        virt(false, CUDNN_DATA_BOOLEAN), virt(false), what);
  const Desc* m = reduce(CUDNN_REDUCE_TENSOR_MAX, *sc, virt(true), "row max");
  const Desc* e = pointwise(CUDNN_POINTWISE_SUB, *sc, m, virt(false), "- max");
  e = pointwise(CUDNN_POINTWISE_EXP, *e, nullptr, virt(false), "exp");
  const Desc* z = reduce(CUDNN_REDUCE_TENSOR_ADD, *e, virt(true), "row sum");
  const Desc* lz = pointwise(CUDNN_POINTWISE_LOG, *z, nullptr, virt(true), "log sum");
  pointwise(CUDNN_POINTWISE_ADD, *m, lz, virt(true), "stats");
  const Desc* p = pointwise(CUDNN_POINTWISE_DIV, *e, z, virt(false, dt), "/ sum");
  matmul(*p, v, o, "p v");

  s.graph = Desc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, what + ": operation graph (biased sdpa chain)");
  s.graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
      .set_descs(CUDNN_ATTR_OPERATIONGRAPH_OPS, ops)
      .finalize();
  return s;
}

SdpaGraph build_graph(const AttentionGeometry& g, cudnnHandle_t handle, const std::string& what) {
  return g.mask_kind == 2 || g.causal ? build_biased_chain(g, handle, what) : build_sdpa_op(g, handle, what);
}

class CudnnAttention final : public Kernel {
 public:
  // choice.plan_json: `plan` serialized (plan_json), empty where cuDNN does not serialize it.
  CudnnAttention(const AttentionGeometry& geo, SdpaGraph graph, Desc plan, CudnnAttentionChoice choice,
                 std::string desc)
      : graph_(std::move(graph)),
        runner_(std::move(plan), uids(geo)),
        choice_(std::move(choice)),
        scale_(geo.scale),
        masked_(geo.mask_kind != 0),
        causal_(geo.causal),
        desc_(std::move(desc)) {
    const size_t es = dtype_size(geo.dtype);
    off_ = {size_t(geo.q_off) * es, size_t(geo.k_off) * es, size_t(geo.v_off) * es, size_t(geo.o_off) * es};
  }

  void run(const void* const* in, void* const* out, const RunContext& rc) const override {
    // Each operand's view starts at its element offset into the buffer (AttentionGeometry).
    void* ptrs[7] = {const_cast<char*>(static_cast<const char*>(in[0]) + off_[0]),
                     const_cast<char*>(static_cast<const char*>(in[1]) + off_[1]),
                     const_cast<char*>(static_cast<const char*>(in[2]) + off_[2]),
                     static_cast<char*>(out[0]) + off_[3],
                     const_cast<float*>(&scale_),
                     nullptr,
                     nullptr};
    size_t n = 5;  // the variant pack in uids(geo)'s order
    if (masked_) ptrs[n++] = const_cast<void*>(in[3]);
    if (causal_) ptrs[n++] = const_cast<float*>(&kLowest);
    const uintptr_t bits = uintptr_t(ptrs[0]) | uintptr_t(ptrs[1]) | uintptr_t(ptrs[2]) | uintptr_t(ptrs[3]) |
                           (masked_ ? uintptr_t(in[3]) : 0);
    KILN_CHECK(bits % 16 == 0, kInvalidArgument,
               "sdpa (cuDNN): q, k, v, the mask and the output must be 16-byte aligned");
    KILN_CHECK(rc.workspace_size >= runner_.workspace_size(), kInvalidArgument, "sdpa (cuDNN): workspace of ",
               rc.workspace_size, " bytes, the plan needs ", runner_.workspace_size());
    runner_.run(ptrs, rc.workspace, stream_of(rc));
  }
  size_t workspace_size() const override { return runner_.workspace_size(); }
  bool bakes_constants() const override { return false; }
  std::string describe() const override { return desc_; }
  Bytes state() const override { return pack_state({}, encode_cudnn_attention(choice_)); }
  void add_note(const std::string& note) { desc_ += "; " + note; }

 private:
  static std::vector<int64_t> uids(const AttentionGeometry& geo) {
    std::vector<int64_t> u = {kUidQ, kUidK, kUidV, kUidO, kUidScale};
    if (geo.mask_kind != 0) u.push_back(kUidBias);
    if (geo.causal) u.push_back(kUidLowest);
    return u;
  }
  static constexpr float kLowest = std::numeric_limits<float>::lowest();  // a dropped score

  SdpaGraph graph_;
  PlanRunner runner_;
  CudnnAttentionChoice choice_;  // what state() saves
  std::array<size_t, 4> off_{};  // bytes from each kernel pointer to its operand's view
  float scale_;  // by-value operand: cuDNN copies it into the launch (captured graphs included)
  bool masked_;  // in[3] is the additive mask, cuDNN's bias
  bool causal_;  // the chain selects kLowest above the diagonal
  std::string desc_;
};

std::string describe(const AttentionGeometry& geo, const EngineId& id, const std::string& note) {
  return "sdpa fused flash attention by cuDNN (" + id.to_string() + ", head dim " + std::to_string(geo.E) + ", " +
         std::to_string(geo.batch_count) + " x " + std::to_string(geo.L) + " x " + std::to_string(geo.S) +
         (geo.mask_kind ? ", additive mask as bias" : "") + (geo.causal ? ", causal" : "") +
         (geo.bshd ? ", bshd strided" : "") + (geo.views ? ", strided views" : "") + ")" +
         (note.empty() ? "" : "; " + note);
}

}  // namespace

bool cudnn_attention_serves(const AttentionGeometry& geo, std::string* why) {
  auto no = [&](const std::string& r) {
    if (why) *why = r;
    return false;
  };
  if (geo.dtype != DType::kF16 && geo.dtype != DType::kBF16) return no("cuDNN's sdpa takes f16/bf16");
  if (geo.batch_rank > 2) return no("more than 2 batch dims");  // before the operands are posed in 4 dims
  if (geo.mask_kind == 1) return no("cuDNN's sdpa takes an additive mask, not a bool one");
  if (geo.mask_kind == 0 && (CUDNN_VERSION < kMinCudnn || cudnnGetVersion() < size_t(kMinCudnn)))
    return no("cuDNN " + std::to_string(cudnnGetVersion()) + " has no fused sdpa operation (9.13 or later)");
  if (geo.mask_kind == 2) {
    if (geo.S > 1 && geo.mask_col_stride != 1) return no("a mask that broadcasts over the keys");
    for (int64_t st : bias_operand(geo).strides)
      if (st % 8 != 0 && st != 1) return no("a mask stride that is not a multiple of 8 elements");
  }
  if (geo.E != geo.Ev || geo.E % 8 != 0 || geo.E > 256) return no("head dims must be equal, a multiple of 8, <= 256");
  for (int i = 0; i < geo.batch_rank; ++i)
    for (const KilnDims* d : {&geo.q_dims, &geo.k_dims, &geo.v_dims, &geo.o_dims})
      if (d->stride[i] == 0 && d->size[i] > 1) return no("a broadcast batch dim");
  for (int64_t row : {geo.q_row, geo.k_row, geo.v_row, geo.o_row})
    if (row % 8 != 0) return no("a row stride that is not a multiple of 8 elements");
  return true;
}

size_t attention_operand_bytes(const AttentionGeometry& geo, int which) {
  const Operand o = which == 4 ? bias_operand(geo) : operand(geo, which);
  const int64_t offsets[5] = {geo.q_off, geo.k_off, geo.v_off, geo.o_off, 0};
  int64_t last = offsets[which];
  for (size_t i = 0; i < 4; ++i) last += (o.dims[i] - 1) * o.strides[i];
  return size_t(last + 1) * dtype_size(geo.dtype);
}

std::vector<std::unique_ptr<Kernel>> cudnn_attention_candidates(const Node& n, const AttentionGeometry& geo,
                                                                size_t limit, size_t workspace_limit,
                                                                std::string* log) {
  std::vector<std::unique_ptr<Kernel>> out;
  const std::string what = "sdpa '" + n.name + "'";
  try {
    std::vector<Desc> heuristic;
    {
      HandleLock hl = lock_handle();
      const SdpaGraph probe = build_graph(geo, hl.handle, what);
      heuristic = heuristic_configs(probe.graph, log);
    }
    // In rounds of as many configs as candidates are still wanted: each kernel owns its graph,
    // built again around its config under the handle's lock; the plans are finalized off the
    // build's turn, in parallel (make_plans): the masked graphs' finalizing compiles cuDNN's kernels.
    for (size_t next = 0; out.size() < limit && next < heuristic.size();) {
      std::vector<SdpaGraph> graphs;
      std::vector<Desc> configs;
      std::vector<EngineId> ids;
      {
        HandleLock hl = lock_handle();
        while (out.size() + configs.size() < limit && next < heuristic.size()) {
          const EngineInfo info = engine_info(heuristic[next++]);
          graphs.push_back(build_graph(geo, hl.handle, what));
          configs.push_back(make_engine_config(graphs.back().graph, info.id));
          ids.push_back(info.id);
        }
      }
      std::vector<const Desc*> round;
      for (const Desc& c : configs) round.push_back(&c);
      std::vector<std::string> why;
      std::vector<Desc> plans = make_plans(round, &why);
      for (size_t i = 0; i < plans.size(); ++i) {
        if (!plans[i]) {
          if (log) *log += ids[i].to_string() + ": " + why[i] + "; ";
          continue;
        }
        if (size_t(plans[i].get_i64(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)) > workspace_limit) {
          if (log) *log += ids[i].to_string() + ": workspace over the limit; ";
          continue;
        }
        CudnnAttentionChoice choice{ids[i], plan_json(plans[i])};
        out.push_back(std::make_unique<CudnnAttention>(geo, std::move(graphs[i]), std::move(plans[i]),
                                                       std::move(choice), describe(geo, ids[i], "")));
      }
    }
  } catch (const Error& e) {
    if (log) *log += std::string("cuDNN refused the sdpa graph: ") + e.what() + "; ";
  }
  return out;
}

std::unique_ptr<Kernel> make_cudnn_attention(const Node& n, const AttentionGeometry& geo,
                                             const CudnnAttentionChoice& choice, const std::string& note) {
  const std::string what = "sdpa '" + n.name + "'";
  std::string why;
  KILN_CHECK(cudnn_attention_serves(geo, &why), kUnsupported, what, ": cuDNN's fused attention cannot serve it: ", why);
  HandleLock hl = lock_handle();
  SdpaGraph graph = build_graph(geo, hl.handle, what);
  CudnnAttentionChoice mine = choice;
  std::string how;
  Desc plan;
  if (!choice.plan_json.empty()) {
    plan = plan_from_json(hl.handle, choice.plan_json);
    how =
        plan ? "plan rebuilt from its serialized form" : "serialized plan refused by this cuDNN, plan finalized again";
  }
  if (!plan) {
    // No serialized plan, or cuDNN refused the text (another cuDNN version?): finalize the
    // config again, which for the masked graph compiles cuDNN's kernel.
    Desc cfg = make_engine_config(graph.graph, choice.id);
    plan = make_plan(hl.handle, cfg, &why);
    KILN_CHECK(bool(plan), kUnsupported, what, ": cuDNN cannot rebuild the saved plan (", choice.id.to_string(),
               "; another cuDNN version or GPU?): ", why);
    mine.plan_json = plan_json(plan);  // what a later save stores
  }
  const std::string notes = note.empty() ? how : how.empty() ? note : note + "; " + how;
  return std::make_unique<CudnnAttention>(geo, std::move(graph), std::move(plan), std::move(mine),
                                          describe(geo, choice.id, notes));
}

Bytes encode_cudnn_attention(const CudnnAttentionChoice& choice) {
  using namespace conv_state_detail;
  Bytes b{kCudnnAttentionTag};
  put<int64_t>(b, choice.id.engine);
  put_knobs(b, choice.id.knobs);
  put_plan_json(b, choice.plan_json, "sdpa state");
  return b;
}

CudnnAttentionChoice decode_cudnn_attention(const Bytes& params) {
  using namespace conv_state_detail;
  KILN_CHECK(!params.empty() && params[0] == kCudnnAttentionTag, kCorrupted, "sdpa state: not a cuDNN attention state");
  Reader r{params, 1};
  CudnnAttentionChoice c;
  c.id.engine = r.get<int64_t>("engine");
  c.id.knobs = get_knobs(r, "sdpa state");
  // States written before the plan was stored end here: no serialized plan.
  if (r.pos == params.size()) return c;
  KILN_CHECK(params.size() - r.pos >= sizeof(uint32_t), kCorrupted, "sdpa state: ", params.size() - r.pos,
             " trailing bytes");
  c.plan_json = get_plan_json(r, "sdpa state");
  KILN_CHECK(r.pos == params.size(), kCorrupted, "sdpa state: ", params.size() - r.pos, " trailing bytes");
  return c;
}

}  // namespace kiln::cuda
