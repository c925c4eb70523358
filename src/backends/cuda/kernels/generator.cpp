// CUDA kernels of the generator family (arange, full), generated and compiled by NVRTC. These
// are usually constant-folded away; the kernels serve what remains (e.g. under dynamic shapes).
//
// full: the value is converted to the dtype's bytes here, exactly as the CPU kernel does (an
// i64 attribute stays exact), and the kernel only replicates them, as the widest word (up to
// 16 bytes) that divides the output. arange: element i is start + i * step computed in double
// and then converted like the CPU (f16 / bf16 through f32; bool is != 0; integers truncate),
// codegen/cuh/generator_arange.cuh.
#include <optional>

#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/codegen/prelude.h"
#include "src/backends/cuda/kernels.h"
#include "src/ops/access.h"

namespace kiln::cuda {

namespace gen {
namespace {

// Whether the generator family runs n: nothing when it does (arange and full, every dtype),
// else the error generate_generator fails with.
std::optional<Error> why_not_generator(const Node& n) {
  if (n.op != OpKind::kArange && n.op != OpKind::kFull)
    return Error(ErrorCode::kInternal, detail::concat(op_name(n.op), " is not in the generator family"));
  return std::nullopt;
}

}  // namespace

Generated generate_generator(const Node& n, const Graph& g) {
  if (std::optional<Error> e = why_not_generator(n)) throw *e;
  const TensorType& yt = g.type(n.outputs[0]);
  const int64_t count = yt.numel();
  Generated gn;
  if (n.op == OpKind::kArange) {
    gn.plan.describe = std::string("cuda arange ") + dtype_name(yt.dtype);
    if (count == 0) return gn;
    const DType dt = yt.dtype;
    // generator_arange.cuh's conversion of the double value: through float, to bool, or a cast.
    const int convert = dt == DType::kF16 || dt == DType::kBF16 ? 1 : dt == DType::kBool ? 2 : 0;
    gn.source = source_head() + "typedef " + storage_type(dt) + " T;\n#define KG_ARANGE_CONVERT " +
                std::to_string(convert) + "\n" + std::string(embedded_source("generator_arange.cuh"));
    Launch l("kg_arange", blocks_for(count, 256), 256);
    l.out(0).f64(n.attrs.get_float("start", 0.0)).f64(n.attrs.get_float("step", 1.0)).i64(count);
    gn.plan.launches.push_back(std::move(l));
    return gn;
  }
  gn.plan.describe = std::string("cuda full ") + dtype_name(yt.dtype);
  const uint64_t bits = full_value_bits(n.attrs, yt.dtype);
  add_fill(gn.source, gn.plan, 0, count, int(dtype_size(yt.dtype)), bits);
  return gn;
}

}  // namespace gen

bool supports_generator(const Node& n, const Graph&, std::string* why) {
  return gen::supported(gen::why_not_generator(n), why);
}

std::unique_ptr<Kernel> make_generator_kernel(const Node& n, const Graph& g, const KernelOptions&, const Bytes* state) {
  if (state) return gen::build({}, gen::what_of(n), state);
  return gen::build(gen::generate_generator(n, g), gen::what_of(n), nullptr);
}

}  // namespace kiln::cuda
