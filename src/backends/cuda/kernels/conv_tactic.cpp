// Choosing the cuDNN plan of a conv node (conv_tactic.h): heuristics, plan finalization,
// timing on scratch buffers, and rebuilding a saved choice.
#include <algorithm>
#include <cmath>

#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/kernels/conv_tactic.h"
#include "src/backends/cuda/libs/cublaslt.h"
#include "src/backends/cuda/tuning/tactics.h"
#include "src/common/element_access.h"
#include "src/common/stopwatch.h"

namespace kiln::cuda {

namespace {

// Numerics Kiln does not accept: f16/bf16 accumulation, inputs down-converted below their type
// (f32 read as f16: allowing TF32 allows 10 mantissa bits in f32's range, not f16's range), and
// for strict f32 (TF32 disabled) tensor cores (TF32), FFT and Winograd.
// `short_sum`: an f16 / bf16 conv over an image (image_input), whose sums are a few hundred
// products, may take a reduced-precision reduction: cuDNN's first-layer kernels (a stem conv's
// fastest) carry that note.
const char* refused_numerics(const EngineInfo& info, bool strict, bool short_sum) {
  if (!short_sum && info.has_numerical(CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION))
    return "reduced-precision reduction";
  if (info.has_numerical(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) return "down-converted inputs";
  if (!strict) return nullptr;
  if (info.has_numerical(CUDNN_NUMERICAL_NOTE_TENSOR_CORE)) return "TF32 tensor cores (allow_tf32 is false)";
  if (info.has_numerical(CUDNN_NUMERICAL_NOTE_FFT) || info.has_numerical(CUDNN_NUMERICAL_NOTE_WINOGRAD))
    return "FFT / Winograd (allow_tf32 is false)";
  return nullptr;
}

// Pseudo-random values in [-1, 1) (xorshift32), as `dt`, in `dev`. Past kRandomPeriod
// elements (a prime, so the pattern lines up with no tensor dim) the block repeats, copied on
// the device: a large activation costs no host work.
constexpr size_t kRandomPeriod = 1048573;
void fill_random(void* dev, size_t count, DType dt, uint32_t seed) {
  const size_t n = std::min(count, kRandomPeriod), es = dtype_size(dt);
  std::vector<float> f(n);
  uint32_t s = seed * 2654435761u + 1;
  for (float& v : f) {
    s ^= s << 13, s ^= s >> 17, s ^= s << 5;
    v = float(s >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
  Bytes host(n * es);
  from_f32(f.data(), dt, host.data(), int64_t(n));
  auto* d = static_cast<uint8_t*>(dev);
  KILN_CUDA_CHECK(cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice));
  for (size_t done = n; done < count;) {  // doubling copies of the filled prefix
    const size_t k = std::min(done, count - done);
    KILN_CUDA_CHECK(cudaMemcpy(d + done * es, d, k * es, cudaMemcpyDeviceToDevice));
    done += k;
  }
}

// The elements compared: all up to kSampleChunks * kSampleChunk, else kSampleChunks runs of
// kSampleChunk elements spread evenly over the tensor (one strided copy).
constexpr size_t kSampleChunk = 1024, kSampleChunks = 1024;
std::vector<float> read_back(const void* dev, size_t count, DType dt) {
  const size_t es = dtype_size(dt);
  const bool all = count <= kSampleChunk * kSampleChunks;
  const size_t n = all ? count : kSampleChunk * kSampleChunks;
  Bytes host(n * es);
  if (all) {
    KILN_CUDA_CHECK(cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost));
  } else {
    const size_t pitch = count / kSampleChunks * es;  // >= kSampleChunk * es, since count is larger
    KILN_CUDA_CHECK(cudaMemcpy2D(host.data(), kSampleChunk * es, dev, pitch, kSampleChunk * es, kSampleChunks,
                                 cudaMemcpyDeviceToHost));
  }
  std::vector<float> f(n);
  to_f32(host.data(), dt, f.data(), int64_t(n));
  return f;
}

// Relative L2 difference within `tol`.
bool close(const std::vector<float>& a, const std::vector<float>& b, double tol, double* diff) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d, den += double(b[i]) * double(b[i]);
  }
  *diff = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return std::isfinite(*diff) && *diff <= tol;
}

// Scratch device buffers for a conv's operands, sized from its geometry.
struct ConvBuffers {
  explicit ConvBuffers(const ConvGeom& q)
      : nx(size_t(q.x_numel())),
        nw(size_t(q.w_numel())),
        ny(size_t(q.y_numel())),
        x(nx * dtype_size(q.dtype)),
        w(nw * dtype_size(q.dtype)),
        bias(size_t(q.O) * dtype_size(q.dtype)),
        res(ny * dtype_size(q.dtype)),
        y(ny * dtype_size(q.dtype)) {}
  // Random values in x, w, and the bias and residual where the conv has them.
  void fill_inputs(const ConvGeom& q) {
    fill_random(x.get(), nx, q.dtype, 1);
    fill_random(w.get(), nw, q.dtype, 2);
    if (q.bias) fill_random(bias.get(), size_t(q.O), q.dtype, 3);
    if (q.residual) fill_random(res.get(), ny, q.dtype, 4);
  }
  const size_t nx, nw, ny;  // elements of x, w, and y (and the residual)
  ScratchBuffer x, w, bias, res, y;
};

// Two engines' outputs: within what TF32 / f16 / bf16 rounding in another order allows.
double engines_tolerance(DType dt, bool strict) { return dt == DType::kF32 ? (strict ? 1e-4 : 1e-2) : 2e-2; }
// The timed winner is kept only when its output, on random inputs, agrees with another
// candidate's: a cuDNN plan that is wrong for one shape then loses to one that passes. Candidates
// are tried in the order winner, then cuDNN's heuristic order (up to three). The scratch
// buffers hold constants while timing, which hides such errors; here they hold random values.
size_t verified_choice(const ConvGeom& q, bool strict, size_t best, const std::vector<Candidate>& fns, ConvBuffers& buf,
                       std::string* note) {
  const DType dt = q.dtype;
  buf.fill_inputs(q);
  std::vector<size_t> order = {best};
  for (size_t i = 0; i < fns.size() && order.size() < 3; ++i)
    if (i != best) order.push_back(i);
  std::vector<std::vector<float>> outs;
  for (size_t c : order) {
    KILN_CUDA_CHECK(cudaMemset(buf.y.get(), 0xFF, buf.ny * dtype_size(dt)));  // NaN: an unwritten output fails
    fns[c](nullptr);
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    outs.push_back(read_back(buf.y.get(), buf.ny, dt));
  }
  std::string why;
  for (size_t a = 0; a < order.size(); ++a) {
    bool agrees = false;
    for (size_t b = 0; b < order.size() && !agrees; ++b) {
      double diff = 0;
      if (a == b) continue;
      agrees = close(outs[a], outs[b], engines_tolerance(dt, strict), &diff);
      if (!agrees) why += detail::concat("#", order[a], " vs #", order[b], " differ by ", diff, ", ");
    }
    if (!agrees) continue;
    if (a > 0 && note) *note += detail::concat("; timed winner #", best, " refused: ", why);
    return order[a];
  }
  if (note) *note += detail::concat("; no candidate passed the checks (", why, "), kept the timed winner");
  return best;
}

struct Cand {
  Desc plan;
  EngineId id;
  size_t ws = 0;
};

}  // namespace

bool strict_f32(DType dt, const BuildPolicy& policy) { return dt == DType::kF32 && !policy.allow_tf32; }

ConvSearch conv_search(const ConvGeom& q, const KernelOptions& options, bool compiled) {
  const TacticBudget budget = options.budget();
  ConvSearch s;
  s.plans = compiled ? budget.compiled_conv_plans : budget.conv_plans;
  s.timed = budget.timed;
  s.timed_candidates = compiled ? budget.compiled_timed_candidates : budget.timed_candidates;
  s.strict = strict_f32(q.dtype, options.policy);
  s.workspace_limit = options.workspace_limit;
  s.precompiled_only = options.precompiled_only;
  return s;
}

bool rebuild_conv_plan(const ConvGeom& q, cudnnHandle_t h, const ConvChoice& c, const std::string& what, ConvPlan& out,
                       std::string* why) {
  try {
    out.og = build_conv_graph(q, h, c.fused || !q.has_epilogue(), what);
    out.choice = c;
    if (!c.plan_json.empty()) {
      out.plan = plan_from_json(h, c.plan_json);
      if (out.plan) return true;
      // Refused (another cuDNN version?): finalize the config again, which compiles.
    }
    EngineId id{c.engine, c.knobs};
    Desc cfg = make_engine_config(out.og.graph, id);
    out.plan = make_plan(h, cfg, why);
    out.choice.plan_json = plan_json(out.plan);  // what a later save stores
    return bool(out.plan);
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

ConvPlan search_conv_plan(const ConvGeom& q, const ConvSearch& search, const std::string& what, uint64_t sig,
                          bool conv_only) {
  const bool short_sum = q.dtype != DType::kF32 && image_input(q);
  const size_t limit = search.plans;
  std::string log;
  std::vector<bool> modes = !q.has_epilogue() ? std::vector<bool>{true}
                            : conv_only       ? std::vector<bool>{false}
                                              : std::vector<bool>{true, false};
  for (bool fused : modes) {
    ConvPlan b;
    Stopwatch watch;
    std::vector<Cand> cands;
    std::vector<Desc> cfgs;
    {
      // The handle's lock only while the graph is built and cuDNN's heuristics read it: the
      // plans are finalized on lanes (make_plans), and timing executes through the handle itself.
      HandleLock hl = lock_handle();
      try {
        b.og = build_conv_graph(q, hl.handle, fused, what);
      } catch (const Error& e) {
        log += std::string(fused ? "fused graph" : "conv graph") + " refused: " + e.what() + "; ";
        continue;
      }
      try {
        cfgs = heuristic_configs(b.og.graph, &log);
      } catch (const Error& e) {
        log += std::string("heuristics failed: ") + e.what() + "; ";
      }
    }
    // In rounds of as many configs as candidates are still wanted, whose plans are finalized
    // in parallel (make_plans): most of a cold build's time otherwise.
    for (size_t next = 0; cands.size() < limit && next < cfgs.size();) {
      std::vector<const Desc*> round;
      std::vector<EngineInfo> infos;
      while (cands.size() + round.size() < limit && next < cfgs.size()) {
        const Desc& cfg = cfgs[next++];
        try {
          const EngineInfo info = engine_info(cfg);
          if (const char* r = refused_numerics(info, search.strict, short_sum)) {
            log += info.id.to_string() + ": " + r + "; ";
            continue;
          }
          if (search.precompiled_only && std::find(info.behavior.begin(), info.behavior.end(),
                                                   CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) != info.behavior.end()) {
            log += info.id.to_string() + ": runtime-compiled (precompiled engines only); ";
            continue;
          }
          round.push_back(&cfg);
          infos.push_back(info);
        } catch (const Error& e) {
          log += std::string("engine config skipped: ") + e.what() + "; ";
        }
      }
      std::vector<std::string> why;
      std::vector<Desc> plans = make_plans(round, &why);
      for (size_t i = 0; i < plans.size(); ++i) {
        try {
          if (!plans[i]) {
            log += infos[i].id.to_string() + ": " + why[i] + "; ";
            continue;
          }
          const size_t ws = size_t(plans[i].get_i64(CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE));
          if (ws > search.workspace_limit) {
            log += infos[i].id.to_string() + ": workspace " + std::to_string(ws) + " B over the limit; ";
            continue;
          }
          cands.push_back({std::move(plans[i]), infos[i].id, ws});
        } catch (const Error& e) {
          log += std::string("engine config skipped: ") + e.what() + "; ";
        }
      }
    }
    if (cands.empty()) {
      log += std::string(fused ? "fused graph (" : "conv graph (") + b.og.ops + "): no usable engine; ";
      continue;
    }
    const double plans_ms = watch.lap();
    size_t best = 0;
    std::string report, verify;
    if (cands.size() > 1 && search.timed) {
      size_t ws = 0;
      for (const auto& c : cands) ws = std::max(ws, c.ws);
      ConvBuffers buf(q);
      ScratchBuffer wsb(ws);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<void*> ptrs;
      for (int64_t uid : b.og.uids)
        ptrs.push_back(conv_data_ptr(uid, buf.x.get(), buf.w.get(), buf.bias.get(), buf.res.get(), buf.y.get()));
      std::vector<Desc> packs;
      std::vector<Candidate> fns;
      for (size_t i = 0; i < cands.size(); ++i) packs.push_back(make_variant_pack(b.og.uids, ptrs, wsb.get()));
      for (size_t i = 0; i < cands.size(); ++i)
        fns.push_back([&, i](cudaStream_t s) { execute(cands[i].plan, packs[i], s); });
      best = time_candidates(fns, search.timed_candidates, &report);
      KILN_CUDA_CHECK(cudaDeviceSynchronize());
      best = verified_choice(q, search.strict, best, fns, buf, &verify);
    }
    b.plan = std::move(cands[best].plan);
    b.choice.fused = fused;
    b.choice.signature = sig;
    b.choice.engine = cands[best].id.engine;
    b.choice.knobs = cands[best].id.knobs;
    b.choice.plan_json = plan_json(b.plan);
    b.note = detail::concat(cands.size(), " candidate plan(s)", report.empty() ? "" : ", timed", verify, " (plans ",
                            int(plans_ms), " ms, timing ", int(watch.ms()), " ms)");
    if (!fused && !conv_only) b.note += "; " + log;
    return b;
  }
  KILN_FAIL(kUnsupported, what, ": cuDNN has no engine for it: ", log);
}

bool runs_in_place(const ConvGeom& q, const Kernel& k) {
  const DType dt = q.dtype;
  ConvBuffers buf(q);
  ScratchBuffer over(buf.ny * dtype_size(dt)), ws(k.workspace_size());
  buf.fill_inputs(q);
  KILN_CUDA_CHECK(cudaMemcpy(over.get(), buf.res.get(), buf.ny * dtype_size(dt), cudaMemcpyDeviceToDevice));
  const void* ins[4] = {buf.x.get(), buf.w.get(), q.bias ? buf.bias.get() : nullptr, buf.res.get()};
  void* outs[1] = {buf.y.get()};
  RunContext rc;
  rc.workspace = ws.get();
  rc.workspace_size = k.workspace_size();
  k.run(ins, outs, rc);
  ins[3] = outs[0] = over.get();
  k.run(ins, outs, rc);
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> a = read_back(buf.y.get(), buf.ny, dt), b = read_back(over.get(), buf.ny, dt);
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i]) && !(std::isnan(a[i]) && std::isnan(b[i]))) return false;
  return true;
}

}  // namespace kiln::cuda
