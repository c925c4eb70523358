// CPU kernel of where(cond, a, b): y = cond ? a : b under numpy broadcasting of all three.
//
// Selecting needs no arithmetic, so the kernel moves elements by their size (1, 2, 4 or 8
// bytes) whatever the dtype; the broadcast is planned once (pw::BroadcastPlan) and run() walks
// runs along the innermost merged dim, split over threads.
#include <cstring>
#include <memory>

#include "src/backends/cpu/kernels.h"
#include "src/ops/pointwise.h"

namespace kiln::cpu {

namespace {

constexpr int64_t kGrain = 32768;

template <typename T>
void select_run(const uint8_t* c, int64_t sc, const T* a, int64_t sa, const T* b, int64_t sb, T* y, int64_t n) {
  if (sc == 1 && sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) y[i] = pw::where_value(c[i] != 0, a[i], b[i]);
  } else if (sc == 1 && sa + sb < 2) {  // a scalar / masked fill: one or both values broadcast
    for (int64_t i = 0; i < n; ++i) y[i] = pw::where_value(c[i] != 0, a[i * sa], b[i * sb]);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = pw::where_value(c[i * sc] != 0, a[i * sa], b[i * sb]);
  }
}

template <typename T>
KernelFn make(std::shared_ptr<const pw::BroadcastPlan> plan) {
  return [plan](const void* const* in, void* const* out, const RunContext&) {
    const pw::BroadcastPlan& p = *plan;
    const auto* c = static_cast<const uint8_t*>(in[0]);
    const T* a = static_cast<const T*>(in[1]);
    const T* b = static_cast<const T*>(in[2]);
    T* y = static_cast<T*>(out[0]);
    const int64_t sc = p.inner_stride(0), sa = p.inner_stride(1), sb = p.inner_stride(2);
    parallel_for(p.numel, kGrain, [&](int64_t begin, int64_t end) {
      p.for_each_run(begin, end, [&](const int64_t* off, int64_t o, int64_t len) {
        select_run(c + off[0], sc, a + off[1], sa, b + off[2], sb, y + o, len);
      });
    });
  };
}

}  // namespace

std::unique_ptr<Kernel> make_where_kernel(const Node& n, const Graph& g) {
  KILN_CHECK(n.op == OpKind::kWhere, kInternal, op_name(n.op), " is not where");
  const TensorType& yt = g.type(n.outputs[0]);
  auto plan = std::make_shared<const pw::BroadcastPlan>(pw::plan_broadcast(
      yt.shape(), {g.type(n.inputs[0]).shape(), g.type(n.inputs[1]).shape(), g.type(n.inputs[2]).shape()}));
  KernelFn fn;
  switch (dtype_size(yt.dtype)) {
    case 1: fn = make<uint8_t>(plan); break;
    case 2: fn = make<uint16_t>(plan); break;
    case 4: fn = make<uint32_t>(plan); break;
    case 8: fn = make<uint64_t>(plan); break;
    default: KILN_FAIL(kUnsupported, "where: no CPU kernel for ", dtype_name(yt.dtype));
  }
  return make_fn_kernel(std::move(fn), std::string("cpu where ") + dtype_name(yt.dtype) + " runs of " +
                                           std::to_string(plan->inner()));
}

}  // namespace kiln::cpu
