// CPU kernels of the gather family, moving elements as opaque 1/2/4/8-byte words.
//
// gather walks the output row by row over its last dim with an odometer that tracks the input
// offset of every dim but `axis` and the index offset (stride 0 in the op's broadcast dims);
// the index value supplies the rest.
// index_select copies, per outer index and selected entry, one contiguous inner block (one
// element when axis is the last dim). Negative indices count from the end, as in PyTorch;
// anything still outside [0, dim) throws kInvalidArgument naming the op and the index rather
// than reading out of bounds. index_select checks its (short) index before writing anything.
#include <algorithm>
#include <array>
#include <string>

#include "src/backends/cpu/kernels.h"
#include "src/ops/access.h"

namespace kiln::cpu {

namespace {

constexpr int kMaxDims = 16;
constexpr int64_t kParallelBytes = int64_t(1) << 18;
constexpr int64_t kChunkBytes = int64_t(1) << 16;

void for_units(int64_t units, int64_t unit_bytes, const std::function<void(int64_t, int64_t)>& fn) {
  if (units <= 0) return;
  if (units * unit_bytes < kParallelBytes || units == 1) return fn(0, units);
  parallel_for(units, std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, unit_bytes)), fn);
}

struct Plan {
  int rank = 0, axis = 0;
  std::array<int64_t, kMaxDims> ext{}, xst{};  // output extents; x strides (0 at axis for gather)
  std::array<int64_t, kMaxDims> ist{};         // gather: index strides (0 in broadcast dims)
  int64_t dim = 0, axis_stride = 0, numel = 0;   // x's extent and stride along axis
  int64_t outer = 1, count = 0, inner = 1;       // index_select: blocks of `inner` elements
  std::string what;                              // "gather: ... of x f32[2,3]", for messages
};

template <typename I>
int64_t checked(const Plan& p, I raw) {
  int64_t v = static_cast<int64_t>(raw);
  if (v < 0) v += p.dim;
  KILN_CHECK(v >= 0 && v < p.dim, kInvalidArgument, p.what, ": index ", static_cast<int64_t>(raw),
             " is out of range for axis ", p.axis, " of size ", p.dim);
  return v;
}

template <typename T, typename I>
void gather_rows(const Plan& p, const T* x, const I* index, T* out, int64_t rb, int64_t re) {
  const int last = p.rank - 1;
  const int64_t L = p.ext[size_t(last)], il = p.ist[size_t(last)];
  const bool along_last = p.axis == last;
  std::array<int64_t, kMaxDims> idx{};
  int64_t off = 0, ioff = 0;
  for (int64_t k = last - 1, r = rb; k >= 0; --k) {
    idx[size_t(k)] = r % p.ext[size_t(k)];
    r /= p.ext[size_t(k)];
    off += idx[size_t(k)] * p.xst[size_t(k)];
    ioff += idx[size_t(k)] * p.ist[size_t(k)];
  }
  for (int64_t r = rb; r < re; ++r) {
    const I* ir = index + ioff;
    T* dst = out + r * L;
    if (along_last) {
      for (int64_t j = 0; j < L; ++j) dst[j] = x[off + checked(p, ir[j * il])];
    } else {
      for (int64_t j = 0; j < L; ++j) dst[j] = x[off + j + checked(p, ir[j * il]) * p.axis_stride];
    }
    for (int k = last - 1; k >= 0; --k) {
      off += p.xst[size_t(k)];
      ioff += p.ist[size_t(k)];
      if (++idx[size_t(k)] < p.ext[size_t(k)]) break;
      off -= p.xst[size_t(k)] * p.ext[size_t(k)];
      ioff -= p.ist[size_t(k)] * p.ext[size_t(k)];
      idx[size_t(k)] = 0;
    }
  }
}

template <typename T, typename I>
KernelFn gather_fn(std::shared_ptr<const Plan> p) {
  return [p](const void* const* in, void* const* out, const RunContext&) {
    if (p->numel == 0) return;
    const int64_t L = p->ext[size_t(p->rank - 1)];
    for_units(p->numel / L, L * int64_t(sizeof(T)), [&](int64_t b, int64_t e) {
      gather_rows<T, I>(*p, static_cast<const T*>(in[0]), static_cast<const I*>(in[1]), static_cast<T*>(out[0]), b, e);
    });
  };
}

template <typename T, typename I>
KernelFn index_select_fn(std::shared_ptr<const Plan> p) {
  return [p](const void* const* in, void* const* out, const RunContext&) {
    const T* x = static_cast<const T*>(in[0]);
    const I* index = static_cast<const I*>(in[1]);
    T* y = static_cast<T*>(out[0]);
    for (int64_t k = 0; k < p->count; ++k) checked(*p, index[k]);
    if (p->numel == 0) return;
    const int64_t inner = p->inner, count = p->count, dim = p->dim;
    for_units(p->outer * count, inner * int64_t(sizeof(T)), [&](int64_t b, int64_t e) {
      for (int64_t u = b; u < e; ++u) {
        const int64_t o = u / count, v = int64_t(index[u % count]);
        const T* src = x + (o * dim + (v < 0 ? v + dim : v)) * inner;
        if (inner == 1) y[u] = *src;
        else std::memcpy(y + u * inner, src, size_t(inner) * sizeof(T));
      }
    });
  };
}

template <typename I>
KernelFn pick(OpKind op, size_t esz, std::shared_ptr<const Plan> p) {
  const bool g = op == OpKind::kGather;
  switch (esz) {
    case 1: return g ? gather_fn<uint8_t, I>(p) : index_select_fn<uint8_t, I>(p);
    case 2: return g ? gather_fn<uint16_t, I>(p) : index_select_fn<uint16_t, I>(p);
    case 4: return g ? gather_fn<uint32_t, I>(p) : index_select_fn<uint32_t, I>(p);
    case 8: return g ? gather_fn<uint64_t, I>(p) : index_select_fn<uint64_t, I>(p);
  }
  KILN_FAIL(kInternal, op_name(op), ": no CPU kernel for elements of ", esz, " bytes");
}

}  // namespace

std::unique_ptr<Kernel> make_gather_kernel(const Node& n, const Graph& g) {
  KILN_CHECK(n.op == OpKind::kGather || n.op == OpKind::kIndexSelect, kInternal, op_name(n.op),
             " is not in the gather family");
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& it = g.type(n.inputs[1]);
  const auto x = xt.shape(), y = g.type(n.outputs[0]).shape();
  auto p = std::make_shared<Plan>();
  p->axis = int(n.attrs.get_int("axis"));
  p->rank = int(y.size());
  p->dim = x[size_t(p->axis)];
  p->numel = g.type(n.outputs[0]).numel();
  p->what = std::string(op_name(n.op)) + " of x " + xt.to_string() + (n.name.empty() ? "" : " ('" + n.name + "')");
  std::vector<int64_t> xs(x.size(), 1);
  for (size_t k = x.size(); k-- > 1;) xs[k - 1] = xs[k] * x[k];
  p->axis_stride = xs[size_t(p->axis)];
  if (n.op == OpKind::kGather) {
    KILN_CHECK(p->rank <= kMaxDims, kUnsupported, op_name(n.op), ": rank ", p->rank,
               " exceeds the CPU kernel's limit of ", kMaxDims);
    for (size_t k = 0; k < y.size(); ++k) p->ext[k] = y[k], p->xst[k] = int(k) == p->axis ? 0 : xs[k];
    const std::vector<int64_t> ist = gather_index_strides(n, g);
    std::copy(ist.begin(), ist.end(), p->ist.begin());
  } else {
    for (int k = 0; k < p->axis; ++k) p->outer *= x[size_t(k)];
    p->count = y[size_t(p->axis)];
    p->inner = p->axis_stride;
  }
  const size_t esz = dtype_size(xt.dtype);
  std::shared_ptr<const Plan> plan = p;
  KernelFn fn = it.dtype == DType::kI64 ? pick<int64_t>(n.op, esz, plan) : pick<int32_t>(n.op, esz, plan);
  return make_fn_kernel(std::move(fn), std::string("cpu ") + op_name(n.op) + " " + dtype_name(it.dtype) + " index");
}

}  // namespace kiln::cpu
