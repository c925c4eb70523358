// The conv family's tactic: which cuDNN engine configuration runs a conv node's graph.
//
// search_conv_plan builds the fused graph (conv_graph.h), asks cuDNN's heuristics for engine
// configs (mode A, then fallback), finalizes plans for the first few (ConvSearch::plans) that
// pass Kiln's numerics rules (f32 accumulation, no down-converted inputs; strict f32, i.e. f32
// data without BuildPolicy::allow_tf32: no TF32 tensor cores, FFT or Winograd) and whose
// workspace fits, times them (tactics.h) and keeps the fastest. When no engine runs the fused graph it does the same for the conv alone (the
// caller then adds a generated epilogue). rebuild_conv_plan remakes a saved choice exactly.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "kiln/backend.h"
#include "src/backends/cuda/kernels/conv_graph.h"
#include "src/backends/cuda/kernels/conv_state.h"

namespace kiln::cuda {

struct ConvPlan {
  ConvOpGraph og;
  Desc plan;
  ConvChoice choice;
  std::string note;  // how it was chosen, for describe()
};

// f32 data without TF32 (BuildPolicy::allow_tf32 false).
bool strict_f32(DType dt, const BuildPolicy& policy);

// What one plan search may do: its counts from the build's TacticBudget, its numerics and
// workspace from the build's options.
struct ConvSearch {
  size_t plans = 1;  // cuDNN plans finalized per graph
  bool timed = false;  // whether the plans are timed (else the first one is kept)
  size_t timed_candidates = 1;  // how many of them are timed, the first ones
  bool strict = false;  // strict_f32
  size_t workspace_limit = 0;
  bool precompiled_only = false;  // KernelOptions::precompiled_only: runtime-compiled engines passed over
};
// The search of conv `q` under `options`; with `compiled`, of a graph whose plans are
// runtime-compiled (TacticBudget::compiled_conv_plans and compiled_timed_candidates).
ConvSearch conv_search(const ConvGeom& q, const KernelOptions& options, bool compiled);

// The fastest plan of the fused graph (conv + epilogue), or of the conv alone when cuDNN cannot
// run the fused one; with conv_only, of the conv alone (its epilogue then runs as a generated
// kernel). Throws kUnsupported (with cuDNN's reasons) when no engine runs the conv.
ConvPlan search_conv_plan(const ConvGeom& q, const ConvSearch& search, const std::string& what, uint64_t sig,
                          bool conv_only = false);
// Whether `k` (a conv kernel of `q`, with a residual) gives the same output when its output is
// written over its residual input: one run with separate buffers and one in place, on random
// inputs, compared element for element (up to a million elements spread over the output). cuDNN
// does not document in-place runs, so each plan is checked where its engine is made.
bool runs_in_place(const ConvGeom& q, const Kernel& k);
// False (and *why) when cuDNN refuses the saved choice `c`.
bool rebuild_conv_plan(const ConvGeom& q, cudnnHandle_t h, const ConvChoice& c, const std::string& what, ConvPlan& out,
                       std::string* why);

}  // namespace kiln::cuda
