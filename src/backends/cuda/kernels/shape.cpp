// CUDA kernels of the shape family (reshape, permute, expand, slice, concat, split, pad, copy),
// generated and compiled by NVRTC. Elements move as opaque words, so one source serves every
// dtype of a size.
//
// Everything but pad is one *strided copy*: an iteration shape walked in row-major order,
// reading the input at sum(i_k * ist_k) and writing the output at sum(i_k * ost_k) (expand:
// input stride 0; slice: start offset and stride * step; concat / split: each part is one copy
// into / out of the joined tensor at its byte offset). At make time unit dims are dropped and
// dims contiguous in both tensors merged; when the innermost run is contiguous in both, the
// copy moves the widest word (up to 16 bytes) that divides every extent, stride and offset.
// When the last dim is strided in the input but some other dim is contiguous there (e.g.
// NCHW -> NHWC), a 32 x 32 tile goes through shared memory so that reads and writes are both
// coalesced. reshape and copy (and a permute, expand or slice that reads its input in order,
// src/ops/access.h) are a flat copy, and no launch at all when their input and output
// pointers are equal (the memory planner's alias rule, src/passes/memory_plan.cpp, puts an
// intermediate's reshape on its input's bytes), so a captured CUDA graph has no node for them.
// pad maps each output coordinate to an input one (constant / reflect / replicate).
#include <algorithm>
#include <numeric>

#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/kernels.h"
#include "src/common/element_access.h"
#include "src/ops/access.h"

namespace kiln::cuda {

namespace gen {
namespace {

struct Walk {
  std::vector<int64_t> ext, ist, ost;
};

Walk collapse(const std::vector<int64_t>& ext, const std::vector<int64_t>& ist, const std::vector<int64_t>& ost) {
  Walk w;
  for (size_t k = 0; k < ext.size(); ++k) {
    if (ext[k] == 1) continue;
    if (!w.ext.empty() && w.ist.back() == ist[k] * ext[k] && w.ost.back() == ost[k] * ext[k]) {
      w.ext.back() *= ext[k];
      w.ist.back() = ist[k], w.ost.back() = ost[k];
    } else {
      w.ext.push_back(ext[k]), w.ist.push_back(ist[k]), w.ost.push_back(ost[k]);
    }
  }
  if (w.ext.empty()) w.ext = {1}, w.ist = {1}, w.ost = {1};
  return w;
}

std::string copy_kernel(int rank, int w, bool wide, bool out_contig) {
  const std::string name =
      "kg_copy_r" + std::to_string(rank) + "_w" + std::to_string(w) + (wide ? "_l" : "_i") + (out_contig ? "_c" : "_s");
  const std::string idx = wide ? "unsigned long long" : "unsigned int";
  std::string s = "extern \"C\" __global__ void " + name + "(const " + word_type(w) + "* __restrict__ x, " +
                  word_type(w) + "* __restrict__ y, Dims d, long long n) {\n";
  s += "  for (" + idx + " i = blockIdx.x * (" + idx + ")blockDim.x + threadIdx.x; i < (" + idx + ")n; i += (" + idx +
       ")gridDim.x * blockDim.x) {\n";
  s += "    " + idx + " r = i; long long io = 0, oo = 0;\n";
  s += "#pragma unroll\n    for (int k = " + std::to_string(rank - 1) + "; k > 0; --k) {\n";
  s += "      const " + idx + " e = (" + idx + ")d.ext[k]; const " + idx + " c = r % e; r /= e;\n";
  s += "      io += (long long)c * d.ist[k]; oo += (long long)c * d.ost[k];\n    }\n";
  s += "    io += (long long)r * d.ist[0]; oo += (long long)r * d.ost[0];\n";
  s += std::string("    y[") + (out_contig ? "i" : "oo") + "] = x[io];\n  }\n}\n";
  return s;
}

std::string transpose_kernel(int batch_rank, int w) {
  const std::string name = "kg_transpose_b" + std::to_string(batch_rank) + "_w" + std::to_string(w);
  std::string s = "extern \"C\" __global__ void " + name + "(const " + std::string(word_type(w)) +
                  "* __restrict__ x, " + word_type(w) +
                  "* __restrict__ y, Dims d, long long L, long long sl, long long D, long long od, long long tilesL,"
                  " long long batch) {\n";
  s += "  __shared__ " + std::string(word_type(w)) + " tile[32][33];\n";
  s += R"(  const long long t = blockIdx.x, l0 = (t % tilesL) * 32, d0 = (t / tilesL) * 32;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (long long b = blockIdx.y; b < batch; b += gridDim.y) {
    long long r = b, io = 0, oo = 0;
)";
  s += "#pragma unroll\n    for (int k = " + std::to_string(batch_rank - 1) + "; k >= 0; --k) {\n";
  s += R"(      const long long c = r % d.ext[k]; r /= d.ext[k];
      io += c * d.ist[k]; oo += c * d.ost[k];
    }
    for (int j = ty; j < 32; j += 8)
      if (l0 + j < L && d0 + tx < D) tile[j][tx] = x[io + (l0 + j) * sl + d0 + tx];
    __syncthreads();
    for (int j = ty; j < 32; j += 8)
      if (d0 + j < D && l0 + tx < L) y[oo + (d0 + j) * od + l0 + tx] = tile[tx][j];
    __syncthreads();
  }
}
)";
  return s;
}

void add_kernel_once(std::string& source, const std::string& kernel) {
  const size_t end = kernel.find('(');
  if (source.find(kernel.substr(0, end) + "(") == std::string::npos) source += kernel;
}

Dims dims_of(const Walk& w, size_t from, size_t count) {
  Dims d{};
  for (size_t k = 0; k < count; ++k) d.ext[k] = w.ext[from + k], d.ist[k] = w.ist[from + k], d.ost[k] = w.ost[from + k];
  return d;
}

// Adds a strided copy of the iteration shape `ext` (element strides ist / ost, byte offsets
// ioff / ooff) from input `in` to output `out`. Returns a short description.
std::string add_strided(std::string& source, Plan& plan, const std::vector<int64_t>& ext,
                        const std::vector<int64_t>& ist, const std::vector<int64_t>& ost, int in, int64_t ioff, int out,
                        int64_t ooff, int esz) {
  const int64_t numel = std::accumulate(ext.begin(), ext.end(), int64_t(1), std::multiplies<>());
  if (numel == 0) return "empty";
  Walk w = collapse(ext, ist, ost);
  const size_t R = w.ext.size();
  KILN_CHECK(R <= size_t(kMaxRank), kUnsupported, "strided copy with ", R,
             " non-mergeable dims (the CUDA kernel takes ", kMaxRank, ")");
  const size_t last = R - 1;
  if (source.empty()) source = source_head() + kDimsDecl;

  // Tiled transpose: the last dim is strided in the input, another dim is contiguous there.
  int dcont = -1;
  if (R >= 2 && w.ost[last] == 1 && w.ist[last] > 1 && w.ext[last] >= 4)
    for (size_t k = 0; k < last; ++k)
      if (w.ist[k] == 1 && w.ext[k] >= 4) dcont = int(k);
  if (dcont >= 0) {
    Walk batch;
    for (size_t k = 0; k < last; ++k)
      if (int(k) != dcont) batch.ext.push_back(w.ext[k]), batch.ist.push_back(w.ist[k]), batch.ost.push_back(w.ost[k]);
    if (batch.ext.empty()) batch.ext = {1}, batch.ist = {0}, batch.ost = {0};
    const int br = int(batch.ext.size());
    add_kernel_once(source, transpose_kernel(br, esz));
    const int64_t L = w.ext[last], D = w.ext[size_t(dcont)];
    const int64_t tilesL = (L + 31) / 32, tilesD = (D + 31) / 32;
    const int64_t nb = std::accumulate(batch.ext.begin(), batch.ext.end(), int64_t(1), std::multiplies<>());
    KILN_CHECK(tilesL * tilesD < (int64_t(1) << 31), kUnsupported, "transpose of ", L, " x ", D, " is too large");
    Launch l("kg_transpose_b" + std::to_string(br) + "_w" + std::to_string(esz), uint32_t(tilesL * tilesD), 32,
             uint32_t(std::min<int64_t>(nb, 65535)), 8);
    l.in(in, ioff).out(out, ooff).val(dims_of(batch, 0, size_t(br)));
    l.i64(L).i64(w.ist[last]).i64(D).i64(w.ost[size_t(dcont)]).i64(tilesL).i64(nb);
    plan.launches.push_back(std::move(l));
    return "tiled transpose";
  }

  // The copy as words of wb bytes (wb > esz: the innermost run is contiguous in both).
  auto copy_launch = [&](Walk v, int wb) {
    if (wb != esz) {
      const int64_t f = wb / esz;
      v.ext[last] /= f;
      for (size_t k = 0; k < last; ++k) v.ist[k] /= f, v.ost[k] /= f;
    }
    const int64_t words = numel * esz / wb;
    bool out_contig = true;
    for (int64_t k = int64_t(R) - 1, s = 1; k >= 0; --k) {
      out_contig = out_contig && (v.ext[size_t(k)] == 1 || v.ost[size_t(k)] == s);
      s *= v.ext[size_t(k)];
    }
    const bool wide = words >= (int64_t(1) << 31);
    add_kernel_once(source, copy_kernel(int(R), wb, wide, out_contig));
    Launch l(
        "kg_copy_r" + std::to_string(R) + "_w" + std::to_string(wb) + (wide ? "_l" : "_i") + (out_contig ? "_c" : "_s"),
        blocks_for(words, 256), 256);
    l.in(in, ioff).out(out, ooff).val(dims_of(v, 0, R)).i64(words);
    return l;
  };
  int wb = esz;
  if (w.ist[last] == 1 && w.ost[last] == 1) {
    std::vector<int64_t> counts = {w.ext[last] * esz, ioff, ooff};
    for (size_t k = 0; k < last; ++k) counts.push_back(w.ist[k] * esz), counts.push_back(w.ost[k] * esz);
    for (int c : {16, 8, 4, 2})
      if (c > esz && std::all_of(counts.begin(), counts.end(), [c](int64_t b) { return b % c == 0; })) {
        wb = c;
        break;
      }
  }
  Launch l = copy_launch(w, wb);
  if (wb != esz) with_fallback(l, uint32_t(wb), copy_launch(w, esz));
  plan.launches.push_back(std::move(l));
  return "copy of " + std::to_string(wb) + "-byte words over " + std::to_string(R) + " dims";
}

std::string pad_name(const std::string& mode, int rank, int esz, bool wide) {
  return "kg_pad_" + mode + "_r" + std::to_string(rank) + "_w" + std::to_string(esz) + (wide ? "_l" : "_i");
}

std::string pad_kernel(const std::string& mode, int rank, int esz, bool wide) {
  const std::string idx = wide ? "long long" : "int";
  std::string s = "extern \"C\" __global__ void " + pad_name(mode, rank, esz, wide) + "(const " + word_type(esz) +
                  "* __restrict__ x, " + word_type(esz) +
                  "* __restrict__ y, PadDims p, unsigned long long fill, long long n) {\n";
  s += "  typedef " + std::string(word_type(esz)) + " W;\n  const W f = (W)fill;\n";
  s += "  for (" + idx + " i = blockIdx.x * (" + idx + ")blockDim.x + threadIdx.x; i < (" + idx + ")n; i += (" + idx +
       ")gridDim.x * blockDim.x) {\n    " + idx + " r = i, io = 0; bool inside = true;\n";
  s += "#pragma unroll\n    for (int k = " + std::to_string(rank - 1) + "; k >= 0; --k) {\n";
  s += "      const " + idx + " e = (" + idx + ")p.oext[k], ie = (" + idx + ")p.iext[k];\n";
  s += "      const " + idx + " c = r % e; r /= e;\n      " + idx + " j = c - (" + idx + ")p.before[k];\n";
  if (mode == "reflect") s += "      j = j < 0 ? -j : (j >= ie ? 2 * (ie - 1) - j : j);\n";
  else if (mode == "replicate") s += "      j = j < 0 ? 0 : (j >= ie ? ie - 1 : j);\n";
  else s += "      inside = inside && j >= 0 && j < ie;\n";
  s += "      io += j * (" + idx + ")p.ist[k];\n    }\n    y[i] = inside ? x[io] : f;\n  }\n}\n";
  return s;
}

// pad with a short last output dim (a channels-last image padded from 3 to 4 channels): a
// thread writes a whole output row of `cols` elements as one word, reading its elements from
// wherever input_perm puts them, so a warp's stores and each input plane's loads stay dense.
std::string pad_rows_name(const std::string& mode, int rank, int esz, int cols, bool wide) {
  return "kg_pad_rows_" + mode + "_r" + std::to_string(rank) + "_w" + std::to_string(esz) + "_c" +
         std::to_string(cols) + (wide ? "_l" : "_i");
}

std::string pad_rows_kernel(const std::string& mode, int rank, int esz, int cols, bool wide) {
  std::string s =
      R"(extern "C" __global__ void NAME(const E* __restrict__ x, O* __restrict__ y, PadDims p, unsigned long long fill, long long n) {
  const E f = (E)fill;
  for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < (I)n; i += (I)gridDim.x * blockDim.x) {
    I r = i, io = 0;
    bool inside = true;
#pragma unroll
    for (int k = LAST - 1; k >= 0; --k) {
      const I e = (I)p.oext[k], ie = (I)p.iext[k];
      const I c = r % e;
      r /= e;
      I j = c - (I)p.before[k];
MAP      io += j * (I)p.ist[k];
    }
    const I ie = (I)p.iext[LAST], st = (I)p.ist[LAST], b = (I)p.before[LAST];
    union { O word; E e[COLS]; } row;
#pragma unroll
    for (int c = 0; c < COLS; ++c) {
      I j = c - b;
      bool in = inside;
MAPL      row.e[c] = in ? x[io + j * st] : f;
    }
    y[i] = row.word;
  }
}
)";
  std::string map, map_last;
  if (mode == "reflect") {
    map = "      j = j < 0 ? -j : (j >= ie ? 2 * (ie - 1) - j : j);\n";
  } else if (mode == "replicate") {
    map = "      j = j < 0 ? 0 : (j >= ie ? ie - 1 : j);\n";
  } else {
    map = "      inside = inside && j >= 0 && j < ie;\n";
    map_last = "      in = in && j >= 0 && j < ie;\n";
  }
  if (map_last.empty()) map_last = map;
  s = replace_all(s, "MAPL", map_last);
  s = replace_all(s, "MAP", map);
  s = replace_all(s, "NAME", pad_rows_name(mode, rank, esz, cols, wide));
  s = replace_all(s, "LAST", std::to_string(rank - 1));
  s = replace_all(s, "COLS", std::to_string(cols));
  s = replace_all(s, "I ", wide ? "long long " : "int ");
  s = replace_all(s, "(I)", wide ? "(long long)" : "(int)");
  return "typedef " + std::string(word_type(esz)) + " E;\ntypedef " + word_type(cols * esz) + " O;\n" + s;
}

struct PadDims {
  long long oext[kMaxRank], iext[kMaxRank], before[kMaxRank], ist[kMaxRank];
};

// pad: one thread per output element, mapping its coordinates to the input's (through
// input_perm's strides when present: an NCHW image padded in C while it moves channels last, in
// one pass). Neighbouring dims that are not padded and are contiguous in the input merge into one
// (a channels-last image padded only in C walks [N*H*W, C]), and indices are 32-bit while the
// tensors allow, so an element costs a few integer divisions rather than one 64-bit division per
// dim.
Generated gen_pad(const Node& n, const Graph& g) {
  const TensorType& xt = g.type(n.inputs[0]);
  auto [x, xs] = pad_input(n, g);
  auto y = g.type(n.outputs[0]).shape();
  auto pads = n.attrs.get_ints("pads");
  if (x.empty()) x = y = xs = {1}, pads = {0, 0};
  const std::string mode = n.attrs.get_string("mode", "constant");
  KILN_CHECK(mode == "constant" || mode == "reflect" || mode == "replicate", kUnsupported, "pad: mode '", mode, "'");
  Generated gn;
  const int64_t numel = g.type(n.outputs[0]).numel();
  gn.plan.describe = "cuda pad " + mode + (n.attrs.has("input_perm") ? " of the input permuted" : "");
  if (numel == 0) return gn;
  const int esz = int(dtype_size(xt.dtype));
  std::vector<int64_t> oext, iext, before, ist;
  for (size_t k = 0; k < x.size(); ++k) {
    const bool padded = pads[2 * k] != 0 || x[k] != y[k];
    const bool merge =
        !padded && !oext.empty() && oext.back() == iext.back() && before.back() == 0 && ist.back() == xs[k] * x[k];
    if (merge) {
      oext.back() *= x[k], iext.back() *= x[k], ist.back() = xs[k];
    } else {
      oext.push_back(y[k]), iext.push_back(x[k]), before.push_back(pads[2 * k]), ist.push_back(xs[k]);
    }
  }
  const int R = int(oext.size());
  KILN_CHECK(R <= kMaxRank, kUnsupported, "pad: ", R, " padded or unmergeable dims exceed the CUDA kernel's ",
             kMaxRank);
  PadDims p{};
  for (int k = 0; k < R; ++k) {
    const auto K = size_t(k);
    p.oext[k] = oext[K], p.iext[k] = iext[K], p.before[k] = before[K], p.ist[k] = ist[K];
  }
  uint64_t fill = 0;
  store_double(&fill, xt.dtype, 0, mode == "constant" ? n.attrs.get_float("value", 0.0) : 0.0);
  // 32-bit indices hold every output index and every (possibly negative) input offset.
  const bool wide = std::max(numel, xt.numel()) >= (int64_t(1) << 30);
  const std::string head = source_head() +
                           "struct PadDims { long long oext[8]; long long iext[8]; long long before[8]; "
                           "long long ist[8]; };\n";
  gn.source = head + pad_kernel(mode, R, esz, wide);
  Launch l(pad_name(mode, R, esz, wide), blocks_for(numel, 256), 256);
  l.in(0).out(0).val(p).val<unsigned long long>(fill).i64(numel);
  const int cols = int(oext.back()), row_bytes = cols * esz;
  if (R > 1 && cols > 1 && (row_bytes == 4 || row_bytes == 8 || row_bytes == 16)) {
    gn.source += pad_rows_kernel(mode, R, esz, cols, wide);
    Launch rows(pad_rows_name(mode, R, esz, cols, wide), blocks_for(numel / cols, 256), 256);
    rows.in(0).out(0).val(p).val<unsigned long long>(fill).i64(numel / cols);
    with_fallback(rows, uint32_t(row_bytes), std::move(l));
    gn.plan.describe += ", a row of " + std::to_string(cols) + " per thread";
    gn.plan.launches.push_back(std::move(rows));
  } else {
    gn.plan.launches.push_back(std::move(l));
  }
  return gn;
}

}  // namespace

Generated generate_shape(const Node& n, const Graph& g) {
  if (n.op == OpKind::kPad) return gen_pad(n, g);
  const TensorType& xt = g.type(n.inputs[0]);
  const int esz = int(dtype_size(xt.dtype));
  const auto x = xt.shape();
  const auto xs = row_major_strides(x);
  Generated gn;
  std::string how;
  switch (n.op) {
    case OpKind::kReshape:
    case OpKind::kCopy: {
      const int64_t numel = xt.numel();
      how = add_strided(gn.source, gn.plan, {numel}, {1}, {1}, 0, 0, 0, 0, esz);
      break;
    }
    case OpKind::kPermute:
    case OpKind::kExpand:
    case OpKind::kSlice: {
      const auto y = g.type(n.outputs[0]).shape();
      const StridedView view = strided_view(n, g);
      how = add_strided(gn.source, gn.plan, y, view.strides, row_major_strides(y), 0, view.offset * esz, 0, 0, esz);
      break;
    }
    case OpKind::kConcat:
    case OpKind::kSplit: {
      const bool join = n.op == OpKind::kConcat;
      const auto axis = size_t(n.attrs.get_int("axis"));
      const ValueId whole = join ? n.outputs[0] : n.inputs[0];
      const auto& parts = join ? n.inputs : n.outputs;
      const auto ws = row_major_strides(g.type(whole).shape());
      int64_t start = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        const auto ps = g.type(parts[i]).shape();
        const int64_t off = start * ws[axis] * esz;
        if (join) how = add_strided(gn.source, gn.plan, ps, row_major_strides(ps), ws, int(i), 0, 0, off, esz);
        else how = add_strided(gn.source, gn.plan, ps, ws, row_major_strides(ps), 0, off, int(i), 0, esz);
        start += ps[axis];
      }
      how = std::to_string(parts.size()) + " parts, last: " + how;
      break;
    }
    default: KILN_FAIL(kInternal, op_name(n.op), " is not in the shape family");
  }
  gn.plan.describe = std::string("cuda ") + op_name(n.op) + " " + how;
  return gn;
}

}  // namespace gen

bool supports_shape(const Node& n, const Graph& g, std::string* why) {
  try {
    gen::generate_shape(n, g);
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

namespace {

// reshape / copy (and views that keep the element order): the generated flat copy, skipped
// when the output is the input's own bytes.
class CopyUnlessAliased final : public Kernel {
 public:
  explicit CopyUnlessAliased(std::unique_ptr<Kernel> copy) : copy_(std::move(copy)) {}
  void run(const void* const* inputs, void* const* outputs, const RunContext& ctx) const override {
    if (inputs[0] == outputs[0]) return;  // aliased by the memory planner: nothing to move
    copy_->run(inputs, outputs, ctx);
  }
  size_t workspace_size() const override { return copy_->workspace_size(); }
  std::string describe() const override { return copy_->describe() + " (none when aliased)"; }
  Bytes state() const override { return copy_->state(); }

 private:
  std::unique_ptr<Kernel> copy_;
};

}  // namespace

std::unique_ptr<Kernel> make_shape_kernel(const Node& n, const Graph& g, const KernelOptions&, const Bytes* state) {
  auto k =
      state ? gen::build({}, gen::what_of(n), state) : gen::build(gen::generate_shape(n, g), gen::what_of(n), nullptr);
  if (reads_input_in_order(n, g)) return std::make_unique<CopyUnlessAliased>(std::move(k));
  return k;
}

}  // namespace kiln::cuda
