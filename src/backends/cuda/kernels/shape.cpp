// CUDA kernels of the shape family (reshape, permute, expand, slice, concat, split, pad, copy),
// generated and compiled by NVRTC. Elements move as opaque words, so one source serves every
// dtype of a size.
//
// Everything but pad is one *strided copy*: an iteration shape walked in row-major order,
// reading the input at sum(i_k * ist_k) and writing the output at sum(i_k * ost_k) (expand:
// input stride 0; slice: start offset and stride * step; split: each part is one copy out of the
// joined tensor at its byte offset). A concat is the exception: its output is [outer, total]
// and each part an [outer, width] block of its columns, and one launch writes up to 8 parts, so
// a concat of many parts (DenseNet's) is few launches. At make time unit dims are dropped and
// dims contiguous in both tensors merged; when the innermost run is contiguous in both, the
// copy moves the widest word (up to 16 bytes) that divides every extent, stride and offset.
// When the last dim is strided in the input but some other dim is contiguous there (e.g.
// NCHW -> NHWC), a 32 x 32 tile goes through shared memory so that reads and writes are both
// coalesced; 2-byte elements whose extents and strides are even move as 4-byte pairs through a
// 64 x 64 tile (128 bytes per warp row), the 32 x 32 kernel the fallback for a buffer that is not
// 4-byte aligned. reshape and copy (and a permute, expand or slice that reads its input in order,
// src/ops/access.h) are a flat copy, and no launch at all when their input and output
// pointers are equal (the memory planner's alias rule, src/passes/memory_plan.cpp, puts an
// intermediate's reshape on its input's bytes), so a captured CUDA graph has no node for them.
// pad maps each output coordinate to an input one (constant / reflect / replicate).
//
// The kernels are templates in codegen/cuh/shape_copy.cuh and shape_pad.cuh; a source holds one
// extern "C" kernel per variant a launch names, calling its template. why_not_shape decides which
// nodes the kernels take (supports_shape), before anything is generated.
#include <algorithm>
#include <numeric>
#include <optional>

#include "src/backends/cuda/codegen/embedded.h"
#include "src/backends/cuda/codegen/plan.h"
#include "src/backends/cuda/kernels.h"
#include "src/common/element_access.h"
#include "src/ops/access.h"
#include "src/ops/shape_rules.h"

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

int64_t product(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t(1), std::multiplies<>());
}

// One strided copy of a shape node: the iteration shape `ext` with element strides ist (input)
// and ost (output), from input `in` at byte offset ioff to output `out` at byte offset ooff.
struct StridedCopy {
  std::vector<int64_t> ext, ist, ost;
  int in = 0;
  int64_t ioff = 0;
  int out = 0;
  int64_t ooff = 0;
};

// The strided copies of a shape node other than pad and concat, in launch order (split: one per
// part, each out of the joined tensor at its byte offset).
std::vector<StridedCopy> copies_of(const Node& n, const Graph& g) {
  const TensorType& xt = g.type(n.inputs[0]);
  const int64_t esz = int64_t(dtype_size(xt.dtype));
  switch (n.op) {
    case OpKind::kReshape:
    case OpKind::kCopy: return {StridedCopy{{xt.numel()}, {1}, {1}, 0, 0, 0, 0}};
    case OpKind::kPermute:
    case OpKind::kExpand:
    case OpKind::kSlice: {
      const auto y = g.type(n.outputs[0]).shape();
      const StridedView view = strided_view(n, g);
      return {StridedCopy{y, view.strides, row_major_strides(y), 0, view.offset * esz, 0, 0}};
    }
    case OpKind::kSplit: {
      const auto axis = size_t(n.attrs.get_int("axis"));
      const auto ws = row_major_strides(xt.shape());
      std::vector<StridedCopy> copies;
      int64_t start = 0;
      for (size_t i = 0; i < n.outputs.size(); ++i) {
        const auto ps = g.type(n.outputs[i]).shape();
        copies.push_back(StridedCopy{ps, ws, row_major_strides(ps), 0, start * ws[axis] * esz, int(i), 0});
        start += ps[axis];
      }
      return copies;
    }
    default: return {};
  }
}

// The strided copies of concat n's parts that it reads through views ("view<i>") other than dense
// ones (add_concat reads those as it reads a part of its own): each into its
// columns of the output, at the part's start along the axis.
std::vector<StridedCopy> viewed_parts(const Node& n, const Graph& g) {
  const auto y = g.type(n.outputs[0]).shape();
  const auto axis = size_t(n.attrs.get_int("axis"));
  const int64_t esz = int64_t(dtype_size(g.type(n.outputs[0]).dtype));
  const auto ys = row_major_strides(y);
  std::vector<StridedCopy> copies;
  int64_t start = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const OperandView v = input_view(n.op, n.attrs, i, g.type(n.inputs[i]));
    const auto ps = v.logical.shape();
    if (!v.dense()) copies.push_back(StridedCopy{ps, v.strides, ys, int(i), v.offset * esz, 0, start * ys[axis] * esz});
    start += ps[axis];
  }
  return copies;
}

// The tiled transpose's contiguous input dim of a collapsed walk (the last dim is strided in the
// input and contiguous in the output, another dim is contiguous in the input), or -1.
int transpose_dim(const Walk& w) {
  const size_t last = w.ext.size() - 1;
  int dcont = -1;
  if (last >= 1 && w.ost[last] == 1 && w.ist[last] > 1 && w.ext[last] >= 4)
    for (size_t k = 0; k < last; ++k)
      if (w.ist[k] == 1 && w.ext[k] >= 4) dcont = int(k);
  return dcont;
}

// Why the kernels cannot make copy c: more dims than the kernels walk after merging, or a
// transpose of more tiles than a grid holds.
std::optional<Error> copy_refusal(const StridedCopy& c) {
  if (product(c.ext) == 0) return std::nullopt;
  const Walk w = collapse(c.ext, c.ist, c.ost);
  const size_t R = w.ext.size();
  if (R > size_t(kMaxRank))
    return Error(ErrorCode::kUnsupported,
                 detail::concat("strided copy with ", R, " non-mergeable dims (the CUDA kernel takes ", kMaxRank, ")"));
  const int dcont = transpose_dim(w);
  if (dcont >= 0) {
    const int64_t L = w.ext[R - 1], D = w.ext[size_t(dcont)];
    const int64_t tilesL = (L + 31) / 32, tilesD = (D + 31) / 32;
    if (tilesL * tilesD >= (int64_t(1) << 31))
      return Error(ErrorCode::kUnsupported, detail::concat("transpose of ", L, " x ", D, " is too large"));
  }
  return std::nullopt;
}

// pad's walk: the output dims, with each run of unpadded dims contiguous in the input merged
// into one, their input extents, padding before and input element strides.
struct PadWalk {
  std::vector<int64_t> oext, iext, before, ist;
};

PadWalk pad_walk(const Node& n, const Graph& g) {
  auto [x, xs] = pad_input(n, g);
  auto y = g.type(n.outputs[0]).shape();
  auto pads = n.attrs.get_ints("pads");
  if (x.empty()) x = y = xs = {1}, pads = {0, 0};
  PadWalk w;
  for (size_t k = 0; k < x.size(); ++k) {
    const bool padded = pads[2 * k] != 0 || x[k] != y[k];
    const bool merge = !padded && !w.oext.empty() && w.oext.back() == w.iext.back() && w.before.back() == 0 &&
                       w.ist.back() == xs[k] * x[k];
    if (merge) {
      w.oext.back() *= x[k], w.iext.back() *= x[k], w.ist.back() = xs[k];
    } else {
      w.oext.push_back(y[k]), w.iext.push_back(x[k]), w.before.push_back(pads[2 * k]), w.ist.push_back(xs[k]);
    }
  }
  return w;
}

// Why the kernels cannot pad as n asks: a mode they lack, or more dims than they walk.
std::optional<Error> pad_refusal(const Node& n, const Graph& g) {
  const std::string mode = n.attrs.get_string("mode", "constant");
  if (mode != "constant" && mode != "reflect" && mode != "replicate")
    return Error(ErrorCode::kUnsupported, detail::concat("pad: mode '", mode, "'"));
  if (g.type(n.outputs[0]).numel() == 0) return std::nullopt;
  const int R = int(pad_walk(n, g).oext.size());
  if (R > kMaxRank)
    return Error(ErrorCode::kUnsupported,
                 detail::concat("pad: ", R, " padded or unmergeable dims exceed the CUDA kernel's ", kMaxRank));
  return std::nullopt;
}

// Whether the shape family runs n: nothing when it does, else the error generate_shape fails
// with (op, pad mode, the kernels' dims and grid limits). Every concat is two-dimensional.
std::optional<Error> why_not_shape(const Node& n, const Graph& g) {
  switch (n.op) {
    case OpKind::kPad: return pad_refusal(n, g);
    case OpKind::kConcat:
      for (const StridedCopy& c : viewed_parts(n, g))
        if (std::optional<Error> e = copy_refusal(c)) return e;
      return std::nullopt;
    case OpKind::kReshape:
    case OpKind::kCopy:
    case OpKind::kPermute:
    case OpKind::kExpand:
    case OpKind::kSlice:
    case OpKind::kSplit:
      for (const StridedCopy& c : copies_of(n, g))
        if (std::optional<Error> e = copy_refusal(c)) return e;
      return std::nullopt;
    default: return Error(ErrorCode::kInternal, detail::concat(op_name(n.op), " is not in the shape family"));
  }
}

const char* index_type(bool wide, bool is_unsigned) {
  if (is_unsigned) return wide ? "unsigned long long" : "unsigned int";
  return wide ? "long long" : "int";
}

std::string copy_name(size_t rank, int w, bool wide, bool out_contig) {
  return "kg_copy_r" + std::to_string(rank) + "_w" + std::to_string(w) + (wide ? "_l" : "_i") +
         (out_contig ? "_c" : "_s");
}

// The extern "C" kernel of one copy variant (shape_copy.cuh's kg_copy).
std::string copy_kernel(size_t rank, int w, bool wide, bool out_contig) {
  const std::string word = word_type(w);
  return "extern \"C\" __global__ void " + copy_name(rank, w, wide, out_contig) + "(const " + word +
         "* __restrict__ x, " + word + "* __restrict__ y, Dims d, long long n) {\n  kg_copy<" + std::to_string(rank) +
         ", " + word + ", " + index_type(wide, true) + ", " + (out_contig ? "true" : "false") + ">(x, y, d, n);\n}\n";
}

std::string transpose_name(int batch_rank, int w) {
  return "kg_transpose_b" + std::to_string(batch_rank) + "_w" + std::to_string(w);
}

// The extern "C" kernel of one tiled transpose variant (shape_copy.cuh's kg_transpose).
std::string transpose_kernel(int batch_rank, int w) {
  const std::string word = word_type(w);
  return "extern \"C\" __global__ void " + transpose_name(batch_rank, w) + "(const " + word + "* __restrict__ x, " +
         word +
         "* __restrict__ y, Dims d, long long L, long long sl, long long D, long long od, long long tilesL,"
         " long long batch) {\n  kg_transpose<" +
         std::to_string(batch_rank) + ", " + word + ">(x, y, d, L, sl, D, od, tilesL, batch);\n}\n";
}

std::string transpose_pairs_name(int batch_rank) { return "kg_transpose_pairs_b" + std::to_string(batch_rank); }

// The extern "C" kernel of the paired transpose of 2-byte elements (shape_copy.cuh).
std::string transpose_pairs_kernel(int batch_rank) {
  return "extern \"C\" __global__ void " + transpose_pairs_name(batch_rank) +
         "(const unsigned short* __restrict__ x, unsigned short* __restrict__ y, Dims d, long long L, long long sl,"
         " long long D, long long od, long long tilesL, long long batch) {\n  kg_transpose_pairs<" +
         std::to_string(batch_rank) + ">(x, y, d, L, sl, D, od, tilesL, batch);\n}\n";
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

// Adds the strided copy c (which copy_refusal accepts) of elements of esz bytes to the source
// and the plan. Returns a short description.
std::string add_strided(std::string& source, Plan& plan, const StridedCopy& c, int esz) {
  const int64_t numel = product(c.ext);
  if (numel == 0) return "empty";
  Walk w = collapse(c.ext, c.ist, c.ost);
  const size_t R = w.ext.size();
  const size_t last = R - 1;
  if (source.empty()) source = source_head() + kDimsDecl + std::string(embedded_source("shape_copy.cuh"));

  // Tiled transpose: the last dim is strided in the input, another dim is contiguous there.
  const int dcont = transpose_dim(w);
  if (dcont >= 0) {
    Walk batch;
    for (size_t k = 0; k < last; ++k)
      if (int(k) != dcont) batch.ext.push_back(w.ext[k]), batch.ist.push_back(w.ist[k]), batch.ost.push_back(w.ost[k]);
    if (batch.ext.empty()) batch.ext = {1}, batch.ist = {0}, batch.ost = {0};
    const int br = int(batch.ext.size());
    add_kernel_once(source, transpose_kernel(br, esz));
    const int64_t L = w.ext[last], D = w.ext[size_t(dcont)];
    const int64_t nb = product(batch.ext);
    auto tiled = [&](const std::string& name, int64_t tile) {
      const int64_t tilesL = (L + tile - 1) / tile, tilesD = (D + tile - 1) / tile;
      Launch l(name, uint32_t(tilesL * tilesD), 32, uint32_t(std::min<int64_t>(nb, 65535)), 8);
      l.in(c.in, c.ioff).out(c.out, c.ooff).val(dims_of(batch, 0, size_t(br)));
      l.i64(L).i64(w.ist[last]).i64(D).i64(w.ost[size_t(dcont)]).i64(tilesL).i64(nb);
      return l;
    };
    // 2-byte elements move as pairs where every extent and stride the pairs cross is even (and,
    // checked per run, the buffers 4-byte aligned: else the 32 x 32 kernel runs).
    bool pairs = esz == 2 && L % 2 == 0 && D % 2 == 0 && w.ist[last] % 2 == 0 && w.ost[size_t(dcont)] % 2 == 0;
    for (size_t k = 0; k < batch.ext.size(); ++k) pairs = pairs && batch.ist[k] % 2 == 0 && batch.ost[k] % 2 == 0;
    if (pairs) {
      add_kernel_once(source, transpose_pairs_kernel(br));
      Launch l = tiled(transpose_pairs_name(br), 64);
      with_fallback(l, 4, tiled(transpose_name(br, esz), 32));
      plan.launches.push_back(std::move(l));
      return "tiled transpose of pairs";
    }
    plan.launches.push_back(tiled(transpose_name(br, esz), 32));
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
    add_kernel_once(source, copy_kernel(R, wb, wide, out_contig));
    Launch l(copy_name(R, wb, wide, out_contig), blocks_for(words, 256), 256);
    l.in(c.in, c.ioff).out(c.out, c.ooff).val(dims_of(v, 0, R)).i64(words);
    return l;
  };
  int wb = esz;
  if (w.ist[last] == 1 && w.ost[last] == 1) {
    std::vector<int64_t> counts = {w.ext[last] * esz, c.ioff, c.ooff};
    for (size_t k = 0; k < last; ++k) counts.push_back(w.ist[k] * esz), counts.push_back(w.ost[k] * esz);
    for (int b : {16, 8, 4, 2})
      if (b > esz && std::all_of(counts.begin(), counts.end(), [b](int64_t x) { return x % b == 0; })) {
        wb = b;
        break;
      }
  }
  Launch l = copy_launch(w, wb);
  if (wb != esz) with_fallback(l, uint32_t(wb), copy_launch(w, esz));
  plan.launches.push_back(std::move(l));
  return "copy of " + std::to_string(wb) + "-byte words over " + std::to_string(R) + " dims";
}

constexpr size_t kConcatParts = 8;  // parts one kg_concat launch writes

struct ConcatParts {
  long long start[kConcatParts + 1];
};

std::string concat_name(int w, bool wide) {
  return "kg_concat_w" + std::to_string(w) + (wide ? "_l" : "_i");
}

// The extern "C" kernel of one concat variant (shape_copy.cuh's kg_concat).
std::string concat_kernel(int w, bool wide) {
  const std::string word = word_type(w);
  std::string params;
  for (size_t k = 0; k < kConcatParts; ++k) params += "const " + word + "* __restrict__ x" + std::to_string(k) + ", ";
  std::string args;
  for (size_t k = 0; k < kConcatParts; ++k) args += std::string("x") + std::to_string(k) + ", ";
  return "extern \"C\" __global__ void " + concat_name(w, wide) + "(" + params + word +
         "* __restrict__ y, ConcatParts p, long long total, long long n) {\n  kg_concat<" + word + ", " +
         index_type(wide, true) + ">(" + args + "y, p, total, n);\n}\n";
}

// Adds the launches of concat n: its output as [outer, total] elements, each non-empty part an
// [outer, width] block of columns, up to kConcatParts parts per launch, moving the widest word
// that divides every width (a narrower fallback for unaligned buffers); a part read through a
// view is a strided copy of its own into its columns. Returns a description.
std::string add_concat(std::string& source, Plan& plan, const Node& n, const Graph& g) {
  const auto y = g.type(n.outputs[0]).shape();
  const auto axis = size_t(n.attrs.get_int("axis"));
  const int esz = int(dtype_size(g.type(n.outputs[0]).dtype));
  const int64_t outer = product(std::vector<int64_t>(y.begin(), y.begin() + int64_t(axis)));
  const int64_t inner = product(std::vector<int64_t>(y.begin() + int64_t(axis) + 1, y.end()));
  // (input, width in elements): the parts read row-major from the start of their buffer (a view
  // that is dense, a batch of 1's included); empty parts and the strided copies of viewed_parts
  // left out.
  std::vector<std::pair<int, int64_t>> parts;
  std::vector<int64_t> cols;  // each such part's first column
  int64_t at = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const OperandView v = input_view(n.op, n.attrs, i, g.type(n.inputs[i]));
    const int64_t width = v.logical.shape()[axis] * inner;
    if (width > 0 && v.dense()) parts.emplace_back(int(i), width), cols.push_back(at);
    at += width;
  }
  const int64_t total = y[axis] * inner;
  if (outer == 0) return "empty";
  std::string viewed;
  for (const StridedCopy& c : viewed_parts(n, g)) viewed += ", a part by " + add_strided(source, plan, c, esz);
  if (parts.empty()) return "every part read through a view" + viewed;
  int64_t common = 0;  // a word divides every part's width when it divides their gcd
  for (const auto& part : parts) common = std::gcd(common, part.second * esz);
  const int wb = word_bytes(esz, {common});
  if (source.empty()) source = source_head() + kDimsDecl + std::string(embedded_source("shape_copy.cuh"));
  // Parts [first, first + count) from output element column col, in words of w bytes.
  auto launch = [&](size_t first, size_t count, int64_t col, int w) {
    const int64_t f = w / esz;
    col /= f;
    ConcatParts p{};
    const bool wide = outer * (total / f) >= (int64_t(1) << 31);
    add_kernel_once(source, concat_kernel(w, wide));
    int64_t span = 0;
    for (size_t k = 0; k < kConcatParts; ++k) {
      p.start[k] = col + span;
      if (k < count) span += parts[first + k].second / f;
    }
    p.start[kConcatParts] = col + span;
    Launch l(concat_name(w, wide), blocks_for(outer * span, 256), 256);
    for (size_t k = 0; k < kConcatParts; ++k) {
      if (k < count) l.in(parts[first + k].first);
      else l.null();
    }
    l.out(0).val(p).i64(total / f).i64(outer * span);
    return l;
  };
  // A launch writes up to kConcatParts parts whose columns follow one another (a viewed part
  // between two others ends a launch).
  size_t launches = 0;
  for (size_t first = 0, count = 0; first < parts.size(); first += count, ++launches) {
    count = 1;
    while (count < kConcatParts && first + count < parts.size() &&
           cols[first + count] == cols[first + count - 1] + parts[first + count - 1].second)
      ++count;
    Launch l = launch(first, count, cols[first], wb);
    if (wb != esz) with_fallback(l, uint32_t(wb), launch(first, count, cols[first], esz));
    plan.launches.push_back(std::move(l));
  }
  return std::to_string(parts.size()) + " parts in " + std::to_string(launches) + " launch(es) of " +
         std::to_string(wb) + "-byte words" + viewed;
}

std::string pad_name(const std::string& mode, int rank, int esz, bool wide) {
  return "kg_pad_" + mode + "_r" + std::to_string(rank) + "_w" + std::to_string(esz) + (wide ? "_l" : "_i");
}

// The extern "C" kernel of one pad variant (shape_pad.cuh's kg_pad).
std::string pad_kernel(const std::string& mode, int rank, int esz, bool wide) {
  const std::string word = word_type(esz);
  return "extern \"C\" __global__ void " + pad_name(mode, rank, esz, wide) + "(const " + word + "* __restrict__ x, " +
         word + "* __restrict__ y, PadDims p, unsigned long long fill, long long n) {\n  kg_pad<kg_mode_" + mode +
         ", " + std::to_string(rank) + ", " + word + ", " + index_type(wide, false) + ">(x, y, p, fill, n);\n}\n";
}

// pad with a short last output dim (a channels-last image padded from 3 to 4 channels): a
// thread writes a whole output row of `cols` elements as one word, reading its elements from
// wherever input_perm puts them, so a warp's stores and each input plane's loads stay dense.
std::string pad_rows_name(const std::string& mode, int rank, int esz, int cols, bool wide) {
  return "kg_pad_rows_" + mode + "_r" + std::to_string(rank) + "_w" + std::to_string(esz) + "_c" +
         std::to_string(cols) + (wide ? "_l" : "_i");
}

// The extern "C" kernel of one pad-rows variant (shape_pad.cuh's kg_pad_rows).
std::string pad_rows_kernel(const std::string& mode, int rank, int esz, int cols, bool wide) {
  const std::string elem = word_type(esz), row = word_type(cols * esz);
  return "extern \"C\" __global__ void " + pad_rows_name(mode, rank, esz, cols, wide) + "(const " + elem +
         "* __restrict__ x, " + row + "* __restrict__ y, PadDims p, unsigned long long fill, long long n) {\n" +
         "  kg_pad_rows<kg_mode_" + mode + ", " + std::to_string(rank) + ", " + elem + ", " + row + ", " +
         std::to_string(cols) + ", " + index_type(wide, false) + ">(x, y, p, fill, n);\n}\n";
}

struct PadDims {
  long long oext[kMaxRank], iext[kMaxRank], before[kMaxRank], ist[kMaxRank];
};

// pad: one thread per output element, mapping its coordinates to the input's (through
// input_perm's strides when present: an NCHW image padded in C while it moves channels last, in
// one pass). Neighbouring dims that are not padded and are contiguous in the input merge into one
// (a channels-last image padded only in C walks [N*H*W, C]), and indices are 32-bit while the
// tensors allow, so an element costs a few integer divisions rather than one 64-bit division per
// dim. why_not_shape has accepted n.
Generated gen_pad(const Node& n, const Graph& g) {
  const TensorType& xt = g.type(n.inputs[0]);
  const std::string mode = n.attrs.get_string("mode", "constant");
  Generated gn;
  const int64_t numel = g.type(n.outputs[0]).numel();
  gn.plan.describe = "cuda pad " + mode + (n.attrs.has("input_perm") ? " of the input permuted" : "");
  if (numel == 0) return gn;
  const int esz = int(dtype_size(xt.dtype));
  const PadWalk w = pad_walk(n, g);
  const int R = int(w.oext.size());
  PadDims p{};
  for (int k = 0; k < R; ++k) {
    const auto K = size_t(k);
    p.oext[k] = w.oext[K], p.iext[k] = w.iext[K], p.before[k] = w.before[K], p.ist[k] = w.ist[K];
  }
  uint64_t fill = 0;
  store_double(&fill, xt.dtype, 0, mode == "constant" ? n.attrs.get_float("value", 0.0) : 0.0);
  // 32-bit indices hold every output index and every (possibly negative) input offset.
  const bool wide = std::max(numel, xt.numel()) >= (int64_t(1) << 30);
  gn.source = source_head() + std::string(embedded_source("shape_pad.cuh")) + pad_kernel(mode, R, esz, wide);
  Launch l(pad_name(mode, R, esz, wide), blocks_for(numel, 256), 256);
  l.in(0).out(0).val(p).val<unsigned long long>(fill).i64(numel);
  const int cols = int(w.oext.back()), row_bytes = cols * esz;
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
  if (std::optional<Error> e = why_not_shape(n, g)) throw *e;
  if (n.op == OpKind::kPad) return gen_pad(n, g);
  const int esz = int(dtype_size(g.type(n.inputs[0]).dtype));
  Generated gn;
  std::string how;
  if (n.op == OpKind::kConcat) {
    gn.plan.describe = "cuda concat " + add_concat(gn.source, gn.plan, n, g);
    return gn;
  }
  const std::vector<StridedCopy> copies = copies_of(n, g);
  for (const StridedCopy& c : copies) how = add_strided(gn.source, gn.plan, c, esz);
  if (n.op == OpKind::kSplit) how = std::to_string(copies.size()) + " parts, last: " + how;
  gn.plan.describe = std::string("cuda ") + op_name(n.op) + " " + how;
  return gn;
}

}  // namespace gen

bool supports_shape(const Node& n, const Graph& g, std::string* why) {
  return gen::supported(gen::why_not_shape(n, g), why);
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
