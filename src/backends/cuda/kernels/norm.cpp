// CUDA kernels of the normalization family (inference), generated and compiled by NVRTC.
//
//   layer_norm: rows of D = the last normalized_rank dims. D <= 1024: one warp per row; D <=
//               16384: one 512-thread block per row; the row stays in registers (vectors of up
//               to 16 bytes), so x is read once (codegen/cuh/norm_layer_rows.cuh). Longer rows: a
//               block per row reading x three times (sum, squared deviations, write).
//   group_norm: one 512-thread block per (sample, group), whose elements are contiguous:
//               sum, squared deviations, then the write with the channel's weight and bias
//               (norm_group.cuh, which also serves layer_norm's long rows). Channels last
//               (layout "nhwc", x [N, H, W, C]): blocks read whole rows of channels in
//               words (norm_group_nhwc.cuh): a block per sample where a sample is small or
//               the batch fills the GPU, else blocks of (sample, chunk of positions), a first
//               kernel writing each chunk's statistics per group, a second combining a
//               sample's chunks and writing. Fewer groups than multiprocessors that would not
//               split, a position of more than 1024 words, or statistics over the workspace
//               limit keep the kernels below, with a group's Cg channels at each position read
//               as runs of Cg elements.
//   few long rows (layer_norm's long rows and group_norm, when plan.h's split_rows splits them:
//               fewer rows than two per multiprocessor, each of at least kSplitMinRow elements):
//               each row in chunks of a 256-thread block each; a first kernel writes each
//               chunk's mean and squared deviations to the workspace, a second combines the
//               row's chunks and writes its chunk, with vectors of up to 16 bytes
//               (norm_split.cuh). Other shapes keep the kernels above.
//   batch_norm: a per-channel kernel folds the running statistics into scale and shift (in
//               the workspace, f64 arithmetic as on the CPU), then y = x * scale + shift
//               (norm_batch.cuh).
// Statistics follow the CPU: f32 (f64 for f64), two-pass mean and biased variance; rstd =
// 1 / sqrt(var + eps) in double, except in the register-cached row kernel, where a row's
// statistics are on its critical path and f32 ones take rsqrtf (within a few f32 ulps of the
// CPU's); y = (x - mean) * rstd, then * weight, then + bias. An
// RMS layer_norm ({rms}, KG_RMS) takes the mean as 0 and skips its pass.
// weight / bias may have x's dtype or f32; absent ones are compiled out.
#include <algorithm>
#include <optional>
#include <vector>

#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/codegen/prelude.h"
#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/kernels.h"
#include "src/ops/shape_rules.h"

namespace kiln::cuda {

namespace gen {
namespace {

constexpr int kBlockThreads = 512;

bool present(const Node& n, size_t i) { return i < n.inputs.size() && n.inputs[i] != kNoValue; }

// Parameter helpers: P_w / P_b loads (or nothing when absent).
std::string param_defs(const Node& n, const Graph& g, size_t first) {
  std::string s;
  const char* names[] = {"p0", "p1", "p2", "p3"};
  for (size_t i = first; i < n.inputs.size() && i - first < 4; ++i)
    if (n.inputs[i] != kNoValue) s += type_defs(names[i - first], g.type(n.inputs[i]).dtype);
  return s;
}

// norm_layer_rows.cuh's parameters of the weight (p = "W") or bias ("B") with elements of psz
// bytes (0: absent): it loads each lane chunk's vec values as whole words, the widest of at most
// 16 bytes that the launch's alignment (vec * esz, checked on every pointer) allows.
std::string param_words(const std::string& p, int vec, int esz, int psz) {
  if (psz == 0) return define("KG_HAS_" + p, 0);
  const int word = std::min({16, vec * esz, vec * psz});
  return define("KG_HAS_" + p, 1) + define("KG_" + p + "_WORD", word_type(word)) +
         define("KG_" + p + "_WORDS", vec * psz / word);
}

// The register-cached row kernel kg_layer_norm_v<vec>. psz_w / psz_b: the weight's and bias's
// element sizes (0 when absent).
std::string layer_rows(bool warp, int group, int epl, int vec, int esz, int psz_w, int psz_b) {
  return define("KG_WARP", warp) + define("KG_GROUP", group) + define("KG_EPL", epl) + define("KG_V", vec) +
         define("KG_VW", word_type(vec * esz)) + param_words("W", vec, esz, psz_w) + param_words("B", vec, esz, psz_b) +
         std::string(embedded_source("norm_layer_rows.cuh"));
}

// Where a group's elements lie: contiguous (layer_norm rows, channels-first group_norm), or
// channels last (group_norm of [N, S, C]: the group's cg channels at each of the S positions).
struct GroupLayout {
  bool nhwc = false;
  int64_t cg = 0;
};

std::string layout_defines(const GroupLayout& l) { return define("KG_NHWC", l.nhwc) + define("KG_CG", l.cg); }

// The widest vector (at most 16 bytes) of contiguous elements a group of len elements is read in.
int group_vec(int64_t len, int esz, const GroupLayout& l) { return split_row(l.nhwc ? l.cg : len, 1, esz).vec; }

// kg_group_norm: groups of n elements (layer_norm long rows, group_norm), a block per group.
std::string group_kernel(bool layer, bool w, bool b, const GroupLayout& l) {
  return define("KG_LAYER", layer) + define("KG_HAS_W", w) + define("KG_HAS_B", b) + layout_defines(l) +
         std::string(embedded_source("norm_group.cuh"));
}

// kg_group_norm's launch over `rows` groups of len elements (group_norm: G groups of Cg channels
// of S elements a sample; layer_norm: G = 1, Cg = len, S = 1).
Launch group_launch(const Node& n, int64_t rows, int64_t len, int64_t G, int64_t Cg, int64_t S, double eps) {
  Launch l("kg_group_norm", blocks_for(rows, 1), kBlockThreads);
  l.in(0).opt_in(n, 1).opt_in(n, 2).out(0).i64(rows).i64(len).i64(G).i64(Cg).i64(S).f64(eps);
  return l;
}

// The split kernels kg_norm_split_stats_v<vec> and kg_norm_split_apply_v<vec> (norm_split.cuh).
std::string split_kernels(bool layer, bool w, bool b, int vec, int esz, const GroupLayout& l) {
  return define("KG_LAYER", layer) + define("KG_HAS_W", w) + define("KG_HAS_B", b) + define("KG_V", vec) +
         define("KG_VW", word_type(vec * esz)) + layout_defines(l) + std::string(embedded_source("norm_split.cuh"));
}

// The split plan of `rows` groups of len elements, x of esz-byte elements loaded in group_vec's
// vectors, with each chunk's two statistics in A (f64 for f64 x, else f32).
SplitPlan norm_split(int64_t rows, int64_t len, int esz, bool f64, const Target& t, const GroupLayout& l = {}) {
  return split_rows(rows, len, group_vec(len, esz, l), 2 * (f64 ? 8 : 4), t);
}

// The two launches of a split norm over `rows` contiguous groups of len elements (group_norm:
// G groups of Cg channels of S elements; layer_norm: G = 1, Cg = len, S = 1), appending their
// kernels to gn.source, and the vector width they load with.
int add_split(Generated& gn, const Node& n, bool layer, int esz, int64_t rows, int64_t len, int64_t G, int64_t Cg,
              int64_t S, double eps, const SplitPlan& sp, const GroupLayout& gl = {}) {
  const bool w = present(n, 1), b = present(n, 2);
  const int vec = group_vec(len, esz, gl);
  const uint32_t blocks = blocks_for(rows * sp.splits, 1);
  auto stats = [&](int v) {
    gn.source += split_kernels(layer, w, b, v, esz, gl);
    Launch l("kg_norm_split_stats_v" + std::to_string(v), blocks, kSplitThreads);
    l.in(0).ws().i64(rows).i64(len).i64(sp.splits).i64(sp.chunk).i64(G);
    return l;
  };
  auto apply = [&](int v) {
    Launch l("kg_norm_split_apply_v" + std::to_string(v), blocks, kSplitThreads);
    l.in(0).opt_in(n, 1).opt_in(n, 2).ws().out(0).i64(rows).i64(len).i64(sp.splits).i64(sp.chunk).i64(G).i64(Cg).i64(S);
    l.f64(eps);
    return l;
  };
  Launch first = stats(vec), second = apply(vec);
  if (vec > 1) {
    with_fallback(first, uint32_t(vec * esz), stats(1));
    with_fallback(second, uint32_t(vec * esz), apply(1));
  }
  gn.plan.launches.push_back(std::move(first));
  gn.plan.launches.push_back(std::move(second));
  gn.plan.workspace = sp.workspace;
  return vec;
}

// Channels-last group_norm (norm_group_nhwc.cuh): words of vec channels (a power of two that
// divides Cg, at most 16 bytes), q = C / vec of them a position, r positions a step. A sample of
// at most kNhwcOneBlock elements, or a batch that fills the GPU with a block per sample, takes
// one block per sample (splits 1); others `splits` chunks of `chunk` positions, about four
// blocks per multiprocessor in all, each of at least kNhwcMinChunk elements, at most
// kNhwcMaxSplits a sample.
struct NhwcPlan {
  int vec = 1;
  int64_t q = 0, r = 1, splits = 1, chunk = 0;
  uint64_t workspace = 0;
};

constexpr int64_t kNhwcMaxThreads = 1024;
constexpr int64_t kNhwcThreads = 256;  // the block's threads where a position has fewer words
constexpr int64_t kNhwcOneBlock = 16384;
constexpr int64_t kNhwcMinChunk = 4096;
constexpr int64_t kNhwcMaxSplits = 128;  // chunks a sample at most: the second kernel combines them all

// The plan, or nothing when a position's words exceed one block or the workspace the limit.
std::optional<NhwcPlan> nhwc_plan(int64_t N, int64_t S, int64_t C, int64_t Cg, int esz, bool f64, const Target& t) {
  NhwcPlan p;
  while (p.vec * 2 * esz <= 16 && Cg % (p.vec * 2) == 0) p.vec *= 2;
  p.q = C / p.vec;
  if (p.q > kNhwcMaxThreads) return std::nullopt;
  p.r = std::max<int64_t>(1, kNhwcThreads / p.q);
  p.chunk = S;
  if (S * C <= kNhwcOneBlock) return p;
  const int64_t steps = (S + p.r - 1) / p.r, min_steps = std::max<int64_t>(1, kNhwcMinChunk / (p.r * C));
  const int64_t most = std::clamp<int64_t>(steps / min_steps, 1, kNhwcMaxSplits);
  const int64_t want = std::clamp<int64_t>((4 * std::max<int64_t>(t.sms, 1) + N - 1) / N, 1, most);
  p.chunk = ((S + want - 1) / want + p.r - 1) / p.r * p.r;
  p.splits = (S + p.chunk - 1) / p.chunk;
  if (p.splits == 1) return p;
  p.workspace = (uint64_t(N * p.splits * (C / Cg)) * 2 * (f64 ? 8 : 4) + 255) / 256 * 256;
  if (p.workspace > t.workspace_limit) return std::nullopt;
  return p;
}

// The launches of a channels-last group_norm (nhwc_plan), with norm_group.cuh's kernel as the
// fallback where a buffer is not aligned to the words.
void add_nhwc(Generated& gn, const Node& n, int esz, int64_t N, int64_t S, int64_t G, int64_t Cg, double eps,
              const NhwcPlan& p) {
  const bool w = present(n, 1), b = present(n, 2);
  gn.source += define("KG_HAS_W", w) + define("KG_HAS_B", b) + define("KG_V", p.vec) +
               define("KG_VW", word_type(p.vec * esz)) + define("KG_CG", Cg) + define("KG_G", G) + define("KG_Q", p.q) +
               define("KG_R", p.r) + std::string(embedded_source("norm_group_nhwc.cuh"));
  const uint32_t threads = uint32_t(p.q * p.r);
  const std::string v = std::to_string(p.vec);
  std::vector<Launch> launches;
  if (p.splits == 1) {
    launches.emplace_back("kg_gn_nhwc_v" + v, blocks_for(N, 1), threads);
    launches.back().in(0).opt_in(n, 1).opt_in(n, 2).out(0).i64(N).i64(S).f64(eps);
  } else {
    for (const char* kernel : {"kg_gn_nhwc_stats_v", "kg_gn_nhwc_apply_v"}) {
      launches.emplace_back(kernel + v, blocks_for(N * p.splits, 1), threads);
      launches.back().in(0).opt_in(n, 1).opt_in(n, 2).ws().out(0).i64(N).i64(S).i64(p.splits).i64(p.chunk).f64(eps);
    }
    gn.plan.workspace = p.workspace;
  }
  if (p.vec > 1) {
    gn.source += group_kernel(false, w, b, {true, Cg});
    with_fallback(launches[0], uint32_t(p.vec * esz), group_launch(n, N * G, Cg * S, G, Cg, S, eps));
    if (launches.size() == 2) with_fallback(launches[1], uint32_t(p.vec * esz), Launch("kg_gn_nhwc_none", 1, 32));
  }
  for (Launch& l : launches) gn.plan.launches.push_back(std::move(l));
}

std::string batch_kernels(bool w, bool b) {
  return define("KG_HAS_W", w) + define("KG_HAS_B", b) + std::string(embedded_source("norm_batch.cuh"));
}

}  // namespace

std::optional<std::string> why_not_norm(const Node& n, const Graph& g) {
  const char* op = op_name(n.op);
  if (n.op != OpKind::kLayerNorm && n.op != OpKind::kGroupNorm && n.op != OpKind::kBatchNorm)
    return detail::concat(op, " is not in the norm family");
  if (n.inputs.empty() || n.inputs[0] == kNoValue) return detail::concat(op, ": x is absent");
  const TensorType& xt = g.type(n.inputs[0]);
  if (!is_floating(xt.dtype)) return detail::concat(op, ": x must be floating, got ", xt.to_string());
  if (auto why = attr_problem(n, "eps", AttrType::kFloat, false)) return why;
  if (xt.numel() == 0) return std::nullopt;  // no launch
  if (n.op == OpKind::kLayerNorm) return attr_problem(n, "normalized_rank", AttrType::kInt, false);
  if (xt.rank() < 2) return detail::concat(op, ": x must be [N, C, ...], got ", xt.to_string());
  if (n.op == OpKind::kGroupNorm) {
    if (auto why = attr_problem(n, "groups", AttrType::kInt, true)) return why;
    if (n.attrs.get_int("groups") == 0) return detail::concat(op, ": groups must not be 0");
  }
  return std::nullopt;
}

Generated generate_norm(const Node& n, const Graph& g) { return generate_norm(n, g, Target{}); }

Generated generate_norm(const Node& n, const Graph& g, const Target& t) {
  if (const auto why = why_not_norm(n, g)) KILN_FAIL(kUnsupported, *why);
  const TensorType& xt = g.type(n.inputs[0]);
  const auto shape = xt.shape();
  const double eps = n.attrs.get_float("eps", 1e-5);
  const int64_t numel = xt.numel();
  const int esz = int(dtype_size(xt.dtype));
  Generated gn;
  // layer_norm and group_norm apply their fused activation as they write (the shape rule gives
  // batch_norm none).
  const pw::Activation act = pw::parse_activation(n.op, n.attrs);
  const bool rms = n.op == OpKind::kLayerNorm && n.attrs.get_bool("rms", false);
  const std::string desc = std::string("cuda ") + op_name(n.op) + (rms ? " (rms) " : " ") + xt.to_string() +
                           (act.none ? "" : " + " + act.name);
  gn.plan.describe = desc + " (empty)";
  if (numel == 0) return gn;
  std::string head = source_head() + type_defs("x", xt.dtype) + "typedef " + compute_of(xt.dtype) + " A;\n";
  if (n.op != OpKind::kBatchNorm)
    head += "#define KG_ACT(v) " + activation_call(act, "(v)") + "\n" + define("KG_RMS", rms);
  const bool w = present(n, 1), b = present(n, 2);

  if (n.op == OpKind::kLayerNorm) {
    const auto k = size_t(n.attrs.get_int("normalized_rank", 1));
    int64_t rows = 1, D = 1;
    for (size_t d = 0; d < shape.size(); ++d) (d + k < shape.size() ? rows : D) *= shape[d];
    // Absent parameters still need a type for the (null) pointer argument.
    head += param_defs(n, g, 1);
    if (!w) head += "typedef float T_p0;\n";
    if (!b) head += "typedef float T_p1;\n";
    if (D <= 32 * kBlockThreads) {
      const bool warp = D <= 1024;
      // Lanes per row: a block, or a warp's lanes that cover the row's words (row_lanes).
      const int G = warp ? row_lanes(D, split_row(D, 1, esz).vec) : kBlockThreads;
      const RowSplit split = split_row(D, G, esz);
      const int epl = split.per_lane, vec = split.vec;
      auto psz = [&](size_t i) { return present(n, i) ? int(dtype_size(g.type(n.inputs[i]).dtype)) : 0; };
      gn.source = head;
      const int64_t per_warp = warp ? 32 / G : 1, warps = (rows + per_warp - 1) / per_warp;
      auto ln = [&](int v) {
        const std::string name = "kg_layer_norm_v" + std::to_string(v);
        gn.source += layer_rows(warp, G, epl, v, esz, psz(1), psz(2));
        // Warps: 4 a block, fewer when they are too few to reach every multiprocessor of a
        // large GPU (one 128-token sequence: 128 rows).
        const uint32_t wpb = warps >= 4 * kLargeGpuSms ? 4 : warps >= 2 * kLargeGpuSms ? 2 : 1;
        Launch l(name, warp ? blocks_for(warps, wpb) : blocks_for(rows, 1), warp ? 32 * wpb : uint32_t(G));
        l.in(0).opt_in(n, 1).opt_in(n, 2).out(0).i64(rows).i64(D).f64(eps);
        return l;
      };
      Launch l = ln(vec);
      if (vec > 1) with_fallback(l, uint32_t(vec * esz), ln(1));
      gn.plan.launches.push_back(std::move(l));
      gn.plan.describe = desc + " (" + (warp ? lanes_name(G) : "block") + " per row in registers, " +
                         std::to_string(vec) + "-wide loads)";
    } else if (const SplitPlan sp = norm_split(rows, D, esz, xt.dtype == DType::kF64, t); sp.split()) {
      gn.source = head;
      const int vec = add_split(gn, n, true, esz, rows, D, 1, D, 1, eps, sp);
      gn.plan.describe = desc + sp.describe("row", vec);
    } else {
      gn.source = head + group_kernel(true, w, b, {});
      gn.plan.launches.push_back(group_launch(n, rows, D, 1, D, 1, eps));
      gn.plan.describe = desc + " (block per row, three passes)";
    }
    return gn;
  }

  const bool nhwc = channels_last(n.op, n.attrs);  // group_norm of [N, H, W, C]
  const size_t cdim = nhwc ? 3 : 1;
  const int64_t N = shape.at(0), C = shape.at(cdim);
  int64_t S = 1;
  for (size_t d = 1; d < shape.size(); ++d)
    if (d != cdim) S *= shape[d];
  if (n.op == OpKind::kGroupNorm) {
    const int64_t G = n.attrs.get_int("groups"), Cg = C / G;
    const GroupLayout gl{nhwc, nhwc ? Cg : 0};
    const std::string where = nhwc ? ", channels last" : "";
    head += param_defs(n, g, 1);
    if (!w) head += "typedef float T_p0;\n";
    if (!b) head += "typedef float T_p1;\n";
    const SplitPlan sp = norm_split(N * G, Cg * S, esz, xt.dtype == DType::kF64, t, gl);
    const auto p = nhwc ? nhwc_plan(N, S, C, Cg, esz, xt.dtype == DType::kF64, t) : std::nullopt;
    // Fewer groups than multiprocessors that a block each covers (a UNet's at batch 1) keep one
    // launch of the block-per-group kernel rather than two over chunks of positions.
    if (p && (p->splits == 1 || sp.split() || N * G >= t.sms)) {
      gn.source = head;
      add_nhwc(gn, n, esz, N, S, G, Cg, eps, *p);
      gn.plan.describe = desc + " (channels last: " +
                         (p->splits == 1 ? std::string("block per sample")
                                         : std::to_string(p->splits) + " blocks per sample of " +
                                               std::to_string(p->chunk) + " positions") +
                         ", " + std::to_string(p->vec) + "-wide loads)";
      return gn;
    }
    if (sp.split()) {
      gn.source = head;
      const int vec = add_split(gn, n, false, esz, N * G, Cg * S, G, Cg, S, eps, sp, gl);
      gn.plan.describe = desc + sp.describe("group", vec) + where;
      return gn;
    }
    gn.source = head + group_kernel(false, w, b, gl);
    gn.plan.launches.push_back(group_launch(n, N * G, Cg * S, G, Cg, S, eps));
    gn.plan.describe = desc + " (block per group" + where + ")";
    return gn;
  }

  // batch_norm
  const bool bw = present(n, 3), bb = present(n, 4);
  head += param_defs(n, g, 1);
  if (!bw) head += "typedef float T_p2;\n";
  if (!bb) head += "typedef float T_p3;\n";
  gn.source = head + batch_kernels(bw, bb);
  const int64_t abytes = xt.dtype == DType::kF64 ? 8 : 4;
  gn.plan.workspace = uint64_t((2 * C * abytes + 255) / 256 * 256);
  Launch prep("kg_bn_prep", blocks_for(C, 256), 256);
  prep.in(1).in(2).opt_in(n, 3).opt_in(n, 4).ws().i64(C).f64(eps);
  Launch apply("kg_bn_apply", blocks_for(numel, 256), 256);
  apply.in(0).ws().out(0).i64(numel).i64(C).i64(S);
  gn.plan.launches.push_back(std::move(prep));
  gn.plan.launches.push_back(std::move(apply));
  gn.plan.describe = desc + " (folded scale and shift)";
  (void)N;
  return gn;
}

}  // namespace gen

bool supports_norm(const Node& n, const Graph& g, std::string* why) {
  return gen::supported(gen::why_not_norm(n, g), why);
}

std::unique_ptr<Kernel> make_norm_kernel(const Node& n, const Graph& g, const KernelOptions& options,
                                         const Bytes* state) {
  if (state) return gen::build({}, gen::what_of(n), state);
  const gen::Target t{current_device().sm_count, options.workspace_limit};
  return gen::build(gen::generate_norm(n, g, t), gen::what_of(n), nullptr);
}

}  // namespace kiln::cuda
