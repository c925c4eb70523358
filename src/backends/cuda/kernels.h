// The CUDA backend's kernel families: one .cpp per family, as in the CPU backend. Each family
// answers whether it can run a node (dtype, rank, attributes; `why` receives the reason when
// not) and makes its kernel. `state` is null when building (choose, time, generate, compile)
// or the Kernel::state() saved in an engine file (remake without timing or compiling).
//
//   pointwise.cpp   unary, binary, where, cast, fused_pointwise   generated (NVRTC)
//   reduce.cpp      reduce_*, argmax                               generated
//   softmax.cpp     softmax, log_softmax                           generated
//   norm.cpp        batch_norm, layer_norm, group_norm             generated
//   pool.cpp        max_pool, avg_pool, adaptive_avg_pool          generated
//   shape.cpp       reshape ... pad, copy                          generated
//   gather.cpp      gather, index_select, embedding                generated
//   generator.cpp   arange, full                                   generated
//   matmul.cpp      matmul, linear (+bias/residual/activation)     cuBLASLt, timed algorithms
//   conv.cpp        conv, conv_transpose (+bias/residual/act.)     cuDNN graph API, timed engines;
//                   depthwise nhwc convs also generated (depthwise.h), 1x1 nhwc convs also
//                   matmul.cpp's GEMM, each timed against cuDNN
//   attention.cpp   sdpa                                           fused kernel; matmul fallback
#pragma once

#include <memory>
#include <string>

#include "kiln/backend.h"
#include "kiln/ir.h"

namespace kiln::cuda {

#define KILN_CUDA_FAMILY(name)                                                                \
  bool supports_##name(const Node& n, const Graph& g, std::string* why);                      \
  std::unique_ptr<Kernel> make_##name##_kernel(const Node& n, const Graph& g, const KernelOptions& options, \
                                               const Bytes* state);

KILN_CUDA_FAMILY(pointwise)
KILN_CUDA_FAMILY(reduce)
KILN_CUDA_FAMILY(softmax)
KILN_CUDA_FAMILY(norm)
KILN_CUDA_FAMILY(pool)
KILN_CUDA_FAMILY(shape)
KILN_CUDA_FAMILY(gather)
KILN_CUDA_FAMILY(generator)
KILN_CUDA_FAMILY(matmul)
KILN_CUDA_FAMILY(conv)
KILN_CUDA_FAMILY(attention)

#undef KILN_CUDA_FAMILY

// The family's answer for any node; needs no device (Backend::supports and device_supports).
bool supports_node(const Node& n, const Graph& g, std::string* why);

}  // namespace kiln::cuda
