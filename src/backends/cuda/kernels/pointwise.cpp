// The CUDA pointwise family: unary, binary, where, cast and fused_pointwise nodes, each run
// by ONE generated kernel (pointwise_program.h) that computes the node's whole op chain per
// element in registers.
//
// At build, make_pointwise_kernel generates the source for the node's program and layout and
// compiles it with NVRTC (cached by source text, so equal nodes compile once); the state it
// saves is the cubin plus the layout's key facts. At load the program and layout are derived
// from the node again (deterministic) and the cubin is loaded; nothing is compiled, and a
// state whose facts disagree with the node is kCorrupted.
//
// run() picks the vectorized kernel (flat layouts, and strided ones whose innermost dim is
// contiguous or broadcast in every non-scalar input) when the layout has one and every pointer
// read or written in vectors is aligned to its vector width (engine buffers always are; caller
// buffers usually), else the grid-stride kernel. Both are plain launches on the run's stream,
// so capturable.
#include <algorithm>
#include <cstring>
#include <optional>

#include "src/backends/cuda/codegen/nvrtc.h"
#include "src/backends/cuda/codegen/pointwise_program.h"
#include "src/backends/cuda/codegen/prelude.h"
#include "src/backends/cuda/device/cuda_util.h"
#include "src/backends/cuda/kernels.h"

namespace kiln::cuda {

namespace {

using pwgen::kMaxPointers;

// The layout's parameters, saved with the cubin: version 2 for a program whose gathered leaves'
// sizes are arguments, 1 for every other (and for gathers with literal sizes, as saved before).
constexpr uint8_t kParamsVersion = 1, kGatherArgumentsVersion = 2;
constexpr unsigned kBlock = 256;

Bytes layout_params(const pwgen::Program& p, const pwgen::Layout& l) {
  Bytes b(5 + l.scalar.size());
  b[0] = !p.gathers.empty() && l.gather_arguments ? kGatherArgumentsVersion : kParamsVersion;
  b[1] = uint8_t(l.flat);
  b[2] = uint8_t(l.wide);
  b[3] = uint8_t(l.rank);
  b[4] = uint8_t(l.vec);
  for (size_t i = 0; i < l.scalar.size(); ++i) b[5 + i] = l.scalar[i];
  return b;
}

unsigned grid_for(int64_t items) {
  const int64_t cap = int64_t(current_device().sm_count) * 16;
  return unsigned(std::clamp<int64_t>((items + kBlock - 1) / kBlock, 1, std::max<int64_t>(cap, 1)));
}

class PointwiseKernel final : public Kernel {
 public:
  PointwiseKernel(std::shared_ptr<const Module> module, const pwgen::Program& p, const pwgen::Layout& l, Bytes state,
                  std::string desc)
      : module_(std::move(module)),
        args_(pwgen::argument_block(p, l)),
        numel_(l.numel),
        num_in_(p.num_inputs),
        num_out_(int(p.outputs.size())),
        state_(std::move(state)),
        desc_(std::move(desc)) {
    for (int i = 0; i < num_in_; ++i)
      offsets_.push_back(l.offsets[size_t(i)] * int64_t(dtype_size(p.dtype[size_t(i)])));
    scalar_ = module_->kernel("kiln_pw");
    grid_ = grid_for(numel_);
    if (l.vec > 1) {
      vector_ = module_->kernel("kiln_pw_vec");
      vec_grid_ = grid_for(numel_ / l.vec);
      for (int i = 0; i < num_in_; ++i)
        align_[size_t(i)] = l.scalar[size_t(i)]  ? 1
                            : l.splat[size_t(i)] ? dtype_size(p.dtype[size_t(i)])
                                                 : dtype_size(p.dtype[size_t(i)]) * size_t(l.vec);
      for (const pwgen::Gather& q : p.gathers) align_[size_t(q.index)] = 1;  // read one index at a time
      for (int k = 0; k < num_out_; ++k)
        align_[size_t(num_in_ + k)] = dtype_size(p.dtype[size_t(p.outputs[size_t(k)])]) * size_t(l.vec);
    }
  }

  void run(const void* const* inputs, void* const* outputs, const RunContext& rc) const override {
    if (numel_ == 0) return;
    const void* ptrs[kMaxPointers];
    void* args[kMaxPointers + 1];
    bool aligned = vector_ != nullptr;
    for (int i = 0; i < num_in_ + num_out_; ++i) {
      ptrs[i] = i < num_in_ ? static_cast<const char*>(inputs[i]) + offsets_[size_t(i)] : outputs[i - num_in_];
      args[i] = &ptrs[i];
      if (aligned) aligned = reinterpret_cast<uintptr_t>(ptrs[i]) % align_[size_t(i)] == 0;
    }
    args[num_in_ + num_out_] = const_cast<int64_t*>(args_.data());
    if (aligned) launch(vector_, dim3(vec_grid_), dim3(kBlock), args, 0, stream_of(rc));
    else launch(scalar_, dim3(grid_), dim3(kBlock), args, 0, stream_of(rc));
  }

  std::string describe() const override { return desc_; }
  Bytes state() const override { return state_; }

 private:
  std::shared_ptr<const Module> module_;
  cudaKernel_t scalar_ = nullptr, vector_ = nullptr;
  std::vector<int64_t> args_;  // the by-value argument block (sizes, strides, constants)
  int64_t numel_;
  std::vector<int64_t> offsets_;  // per input: bytes past its pointer where the node reads it
  int num_in_, num_out_;
  unsigned grid_ = 1, vec_grid_ = 1;
  size_t align_[kMaxPointers] = {};
  Bytes state_;
  std::string desc_;
};

std::string describe_program(const Node& n, const pwgen::Program& p, const pwgen::Layout& l) {
  std::string d = "cuda generated ";
  if (n.op == OpKind::kFusedPointwise) {
    d += "fused_pointwise[";
    for (size_t k = 0; k < p.steps.size(); ++k) {
      if (k) d += ',';
      d += op_name(p.steps[k].op);
    }
    d += "]";
  } else {
    d += op_name(n.op);
  }
  d += std::string(" ") + dtype_name(p.dtype[size_t(p.outputs[0])]);
  d += l.flat ? " flat" : " strided rank " + std::to_string(l.rank);
  if (l.vec > 1) d += " vec" + std::to_string(l.vec);
  if (l.wide) d += " i64-index";
  return d;
}

}  // namespace

bool supports_pointwise(const Node& n, const Graph& g, std::string* why) { return pwgen::check(n, g, why); }

std::unique_ptr<Kernel> make_pointwise_kernel(const Node& n, const Graph& g, const KernelOptions& options,
                                              const Bytes* state) {
  (void)options;
  std::string why;
  KILN_CHECK(pwgen::check(n, g, &why), kUnsupported, "CUDA ", op_name(n.op), " node '", n.name, "': ", why);
  pwgen::Program p;
  KILN_CHECK(pwgen::program_of(n, g, &p, &why), kInternal, "CUDA ", op_name(n.op), " node '", n.name, "': ", why);
  bool ok = true;
  pwgen::Layout l = pwgen::layout_of(n, g, p, &why, &ok);
  KILN_CHECK(ok, kInternal, "CUDA ", op_name(n.op), " node '", n.name, "': ", why);
  std::optional<CompiledState> stored;
  if (state) {
    stored = unpack_state(*state);
    // An engine saved by an earlier Kiln may hold a narrower vector for the same layout, or
    // gathers whose sizes its source has as literals.
    if (stored->params.size() > 4) pwgen::adopt_saved_width(l, stored->params[4]);
    if (!stored->params.empty() && stored->params[0] == kParamsVersion) l.gather_arguments = false;
  }
  const Bytes params = layout_params(p, l);
  const std::string desc = describe_program(n, p, l);
  std::shared_ptr<const Module> module;
  Bytes saved;
  if (stored) {
    CompiledState& cs = *stored;
    KILN_CHECK(cs.params == params, kCorrupted, "stored CUDA kernel of ", op_name(n.op), " node '", n.name,
               "' was made for another layout of the node");
    saved = *state;
    module = Module::load(std::move(cs.cubin));
  } else {
    module = Module::compile(pwgen::generate(p, l), std::string(op_name(n.op)) + " node '" + n.name + "'");
    saved = pack_state(module->cubin(), params);
  }
  return std::make_unique<PointwiseKernel>(std::move(module), p, l, std::move(saved), desc);
}

}  // namespace kiln::cuda
