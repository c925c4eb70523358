// STUB: CPU kernels of the cast family (to be written).
#include "src/backends/cpu/kernels.h"

namespace kiln::cpu {

std::unique_ptr<Kernel> make_cast_kernel(const Node& n, const Graph&) {
  KILN_FAIL(kUnsupported, op_name(n.op), ": no CPU kernel yet");
}

}  // namespace kiln::cpu
