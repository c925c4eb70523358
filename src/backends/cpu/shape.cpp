// CPU kernels of the shape family. Every op writes a fresh dense output; elements are moved
// as opaque 1/2/4/8-byte words, so one instantiation per element size serves every dtype.
//
// permute, expand and slice are one strided copy: the output walked in row-major order reads
// the input at offset + sum(i_k * stride_k) (expand: stride 0; slice: start offset, stride *
// step). The factory coalesces dims that are contiguous in both (and drops unit dims), then
// picks: one memcpy; rows (a memcpy per row when the last dim stays contiguous, a broadcast
// fill when its stride is 0, a strided loop otherwise); or, when the input-contiguous dim is
// not the last one, a tiled transpose so reads and writes both stay within cache lines.
// concat and split are memcpys of whole blocks per outer index; a concat part read through a
// view ("view<i>") is copied element by element through the view's strides. pad maps each output index
// per dim to an input index (or "fill") through tables built here, and copies the unpadded
// middle of each row with memcpy. reshape and copy are a memcpy, and nothing at all when the
// memory planner put the output on the input's bytes (its alias rule, src/passes/memory_plan.cpp:
// equal pointers; a memcpy onto itself would be undefined). Large copies run in parallel over
// rows, tiles or byte ranges; run() does no allocation.
#include <algorithm>
#include <array>
#include <vector>

#include "src/backends/cpu/kernels.h"
#include "src/ops/access.h"
#include "src/ops/shape_rules.h"

namespace kiln::cpu {

namespace {

constexpr int kMaxDims = 16;
constexpr int64_t kParallelBytes = int64_t(1) << 18;  // below this, threads cost more than they save
constexpr int64_t kChunkBytes = int64_t(1) << 16;

// parallel_for over `units` of roughly `unit_bytes` each, serial for small totals.
void for_units(int64_t units, int64_t unit_bytes, const std::function<void(int64_t, int64_t)>& fn) {
  if (units <= 0) return;
  if (units * unit_bytes < kParallelBytes || units == 1) return fn(0, units);
  parallel_for(units, std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(1, unit_bytes)), fn);
}

void copy_bytes(void* dst, const void* src, int64_t bytes) {
  if (bytes <= 0 || dst == src) return;
  for_units((bytes + kChunkBytes - 1) / kChunkBytes, kChunkBytes, [&](int64_t b, int64_t e) {
    const int64_t lo = b * kChunkBytes, hi = std::min(bytes, e * kChunkBytes);
    std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, size_t(hi - lo));
  });
}

// ---- strided copy (permute, expand, slice) --------------------------------------------
struct Walk {
  int rank = 0;
  std::array<int64_t, kMaxDims> ext{}, st{}, ost{};  // extents, input strides, output strides
  int64_t off = 0, numel = 0;
  int d = -1;  // the dim read contiguously, when the tiled transpose is used
};

Walk coalesce(const Node& n, const std::vector<int64_t>& ext, const std::vector<int64_t>& st, int64_t off) {
  Walk w;
  w.off = off;
  w.numel = 1;
  for (int64_t e : ext) w.numel *= e;
  std::vector<int64_t> e2, s2;
  for (size_t k = 0; k < ext.size(); ++k) {
    if (ext[k] == 1) continue;
    if (!e2.empty() && s2.back() == st[k] * ext[k]) {
      e2.back() *= ext[k];
      s2.back() = st[k];
    } else {
      e2.push_back(ext[k]);
      s2.push_back(st[k]);
    }
  }
  KILN_CHECK(e2.size() <= size_t(kMaxDims), kUnsupported, op_name(n.op), ": ", e2.size(),
             " non-contiguous dims exceed the CPU kernel's limit of ", kMaxDims);
  w.rank = int(e2.size());
  int64_t o = 1;
  for (int k = w.rank - 1; k >= 0; --k) {
    w.ext[size_t(k)] = e2[size_t(k)], w.st[size_t(k)] = s2[size_t(k)], w.ost[size_t(k)] = o;
    o *= e2[size_t(k)];
  }
  const int last = w.rank - 1;
  if (w.rank >= 2 && w.st[size_t(last)] != 1 && w.st[size_t(last)] != 0 && w.ext[size_t(last)] >= 8)
    for (int k = 0; k < last; ++k)
      if (w.st[size_t(k)] == 1 && w.ext[size_t(k)] >= 8) w.d = k;
  return w;
}

template <typename T>
void copy_rows(const Walk& w, const T* in, T* out, int64_t rb, int64_t re) {
  const int last = w.rank - 1;
  const int64_t L = w.ext[size_t(last)], sl = w.st[size_t(last)];
  std::array<int64_t, kMaxDims> idx{};
  int64_t off = w.off;
  for (int64_t k = last - 1, r = rb; k >= 0; --k) {
    idx[size_t(k)] = r % w.ext[size_t(k)];
    r /= w.ext[size_t(k)];
    off += idx[size_t(k)] * w.st[size_t(k)];
  }
  for (int64_t r = rb; r < re; ++r) {
    const T* src = in + off;
    T* dst = out + r * L;
    if (sl == 1) std::memcpy(dst, src, size_t(L) * sizeof(T));
    else if (sl == 0) std::fill(dst, dst + L, *src);
    else for (int64_t j = 0; j < L; ++j) dst[j] = src[j * sl];
    for (int k = last - 1; k >= 0; --k) {  // odometer over the row dims
      off += w.st[size_t(k)];
      if (++idx[size_t(k)] < w.ext[size_t(k)]) break;
      off -= w.st[size_t(k)] * w.ext[size_t(k)];
      idx[size_t(k)] = 0;
    }
  }
}

// Square tiles whose stack buffer (at most 32 KiB) stays in L1: 64 elements a side, 128 for
// narrow elements so that each tile row still spans whole cache lines.
template <typename T>
constexpr int64_t tile_of() { return sizeof(T) <= 2 ? 128 : 64; }

// dst[i][j] = src[j][i] for an 8 x 8 block; fixed bounds let the compiler keep it in registers.
template <typename T>
inline void transpose8(const T* src, int64_t ls, T* dst, int64_t ld) {
  T r[8][8];
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 8; ++i) r[i][j] = src[j * ls + i];
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) dst[i * ld + j] = r[i][j];
}

// Units are (outer index, block of tiles along dim d); each moves a tile x L panel, one tile at
// a time through a stack buffer: the input tile is read along d (contiguous) and the output
// written along the last dim (contiguous), so neither side walks memory at a large stride,
// which with power-of-two strides would evict its own cache lines.
template <typename T>
void copy_tiles(const Walk& w, const T* in, T* out, int64_t ub, int64_t ue) {
  constexpr int64_t tile = tile_of<T>();
  T buf[tile * tile];
  const int last = w.rank - 1, d = w.d;
  const int64_t L = w.ext[size_t(last)], sl = w.st[size_t(last)], D = w.ext[size_t(d)], od = w.ost[size_t(d)];
  const int64_t nb = (D + tile - 1) / tile;
  for (int64_t u = ub; u < ue; ++u) {
    int64_t rem = u / nb, io = w.off, oo = 0;
    for (int k = last - 1; k >= 0; --k) {
      if (k == d) continue;
      const int64_t i = rem % w.ext[size_t(k)];
      rem /= w.ext[size_t(k)];
      io += i * w.st[size_t(k)], oo += i * w.ost[size_t(k)];
    }
    const int64_t i0 = (u % nb) * tile, ni = std::min(D - i0, tile);
    for (int64_t j0 = 0; j0 < L; j0 += tile) {
      const int64_t nj = std::min(L - j0, tile);
      for (int64_t j = 0; j < nj; ++j)
        std::memcpy(buf + j * tile, in + io + i0 + (j0 + j) * sl, size_t(ni) * sizeof(T));
      T* dst = out + oo + i0 * od + j0;
      const int64_t ni8 = ni / 8 * 8, nj8 = nj / 8 * 8;
      for (int64_t i = 0; i < ni8; i += 8)
        for (int64_t j = 0; j < nj8; j += 8) transpose8(buf + j * tile + i, tile, dst + i * od + j, od);
      for (int64_t i = 0; i < ni; ++i)  // the ragged right and bottom edges
        for (int64_t j = i < ni8 ? nj8 : 0; j < nj; ++j) dst[i * od + j] = buf[j * tile + i];
    }
  }
}

template <typename T>
KernelFn strided_fn(Walk w) {
  return [w](const void* const* inputs, void* const* outputs, const RunContext&) {
    const T* in = static_cast<const T*>(inputs[0]);
    T* out = static_cast<T*>(outputs[0]);
    if (w.numel == 0) return;
    if (w.rank == 0 || (w.rank == 1 && w.st[0] == 1)) return copy_bytes(out, in + w.off, w.numel * int64_t(sizeof(T)));
    const int64_t L = w.ext[size_t(w.rank - 1)];
    if (w.d >= 0) {
      constexpr int64_t tile = tile_of<T>();
      const int64_t panel = std::min<int64_t>(tile, w.ext[size_t(w.d)]) * L;
      const int64_t units = w.numel / (w.ext[size_t(w.d)] * L) * ((w.ext[size_t(w.d)] + tile - 1) / tile);
      for_units(units, panel * int64_t(sizeof(T)), [&](int64_t b, int64_t e) { copy_tiles<T>(w, in, out, b, e); });
    } else {
      for_units(w.numel / L, L * int64_t(sizeof(T)), [&](int64_t b, int64_t e) { copy_rows<T>(w, in, out, b, e); });
    }
  };
}

template <template <typename> class F, typename... Args>
auto by_size(size_t esz, Args&&... args) {
  switch (esz) {
    case 1: return F<uint8_t>::make(std::forward<Args>(args)...);
    case 2: return F<uint16_t>::make(std::forward<Args>(args)...);
    case 4: return F<uint32_t>::make(std::forward<Args>(args)...);
    case 8: return F<uint64_t>::make(std::forward<Args>(args)...);
  }
  KILN_FAIL(kInternal, "no CPU data movement for elements of ", esz, " bytes");
}

template <typename T>
struct Strided {
  static KernelFn make(const Walk& w) { return strided_fn<T>(w); }
};

std::unique_ptr<Kernel> make_strided(const Node& n, const Graph& g) {
  const TensorType& xt = g.type(n.inputs[0]);
  const auto x = xt.shape(), y = g.type(n.outputs[0]).shape();
  const StridedView view = strided_view(n, g);
  const Walk w = coalesce(n, y, view.strides, view.offset);
  const bool whole = w.rank == 0 || (w.rank == 1 && w.st[0] == 1);
  const char* how = w.numel == 0 ? "empty" : whole ? "memcpy" : w.d >= 0 ? "tiled" : "rows";
  return make_fn_kernel(by_size<Strided>(dtype_size(xt.dtype), w),
                        std::string("cpu ") + op_name(n.op) + " " + how);
}

// ---- concat / split: blocks of (extent along axis) x (inner size) per outer index ------------
struct Blocks {
  int64_t outer = 1, row = 0;         // bytes of one outer row of the joined tensor
  std::vector<int64_t> bytes, start;  // per part: block bytes and its offset within the row
};

// `parts`: the parts' types (as the node reads them).
Blocks blocks(const TensorType& joined, const std::vector<TensorType>& parts, int64_t axis) {
  const auto shape = joined.shape();
  const size_t esz = dtype_size(joined.dtype);
  Blocks b;
  int64_t inner = int64_t(esz);
  for (size_t k = 0; k < shape.size(); ++k) {
    if (int64_t(k) < axis) b.outer *= shape[k];
    if (int64_t(k) > axis) inner *= shape[k];
  }
  for (const TensorType& p : parts) {
    b.start.push_back(b.row);
    b.bytes.push_back(p.dims[size_t(axis)].extent * inner);
    b.row += b.bytes.back();
  }
  return b;
}

// Copies concat part i, read through `view`, into its columns of the joined tensor (blocks b):
// element e of the part (row-major over the view's sizes) goes to outer row e / w, column
// e % w of the part's block (w its width in elements).
void copy_viewed_part(const Blocks& b, size_t i, const OperandView& view, size_t esz, const void* in, void* out) {
  const int64_t n = view.logical.numel(), width = b.bytes[i] / int64_t(esz);
  const std::vector<int64_t> sizes = view.logical.shape();
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  for (int64_t e = 0; e < n; ++e) {
    const int64_t at = view.offset + strided_offset(e, sizes, view.strides);
    std::memcpy(dst + (e / width) * b.row + b.start[i] + (e % width) * int64_t(esz), src + at * int64_t(esz), esz);
  }
}

// Copies every block between the joined tensor and its parts: concat joins in[i] into
// out[0], split cuts in[0] into out[i]. Parts marked in `skip` are left alone.
void move_blocks(const Blocks& b, bool join, const void* const* in, void* const* out,
                 const std::vector<char>& skip = {}) {
  auto copy = [&](size_t i, int64_t o, bool whole_copy) {
    if (i < skip.size() && skip[i]) return;
    char* dst = static_cast<char*>(join ? out[0] : out[i]) + (join ? o * b.row + b.start[i] : o * b.bytes[i]);
    const char* src = static_cast<const char*>(join ? in[i] : in[0]) + (join ? o * b.bytes[i] : o * b.row + b.start[i]);
    if (whole_copy) copy_bytes(dst, src, b.bytes[i]);
    else if (b.bytes[i] > 0) std::memcpy(dst, src, size_t(b.bytes[i]));
  };
  if (b.outer == 1) {  // one block per part: each copy may itself be split over threads
    for (size_t i = 0; i < b.bytes.size(); ++i) copy(i, 0, true);
    return;
  }
  for_units(b.outer, b.row, [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o)
      for (size_t i = 0; i < b.bytes.size(); ++i) copy(i, o, false);
  });
}

std::unique_ptr<Kernel> make_concat_split(const Node& n, const Graph& g) {
  const int64_t axis = n.attrs.get_int("axis");
  const bool join = n.op == OpKind::kConcat;
  const std::vector<ValueId>& parts = join ? n.inputs : n.outputs;
  std::vector<OperandView> views;  // how each part is read (a concat's may be views)
  std::vector<TensorType> types;
  for (size_t i = 0; i < parts.size(); ++i) {
    views.push_back(join ? input_view(n.op, n.attrs, i, g.type(parts[i])) : dense_view(g.type(parts[i])));
    types.push_back(views.back().logical);
  }
  auto b = std::make_shared<const Blocks>(blocks(g.type(join ? n.outputs[0] : n.inputs[0]), types, axis));
  const bool viewed = std::any_of(views.begin(), views.end(), [](const OperandView& v) { return !v.dense(); });
  if (!viewed) {
    auto fn = [b, join](const void* const* in, void* const* out, const RunContext&) { move_blocks(*b, join, in, out); };
    return make_fn_kernel(fn, std::string("cpu ") + op_name(n.op) + " blocks");
  }
  const size_t esz = dtype_size(g.type(n.outputs[0]).dtype);
  std::vector<char> skip;
  for (const OperandView& v : views) skip.push_back(!v.dense());
  auto fn = [b, views, skip, esz](const void* const* in, void* const* out, const RunContext&) {
    move_blocks(*b, true, in, out, skip);
    for (size_t i = 0; i < views.size(); ++i)
      if (skip[i]) copy_viewed_part(*b, i, views[i], esz, in[i], out[0]);
  };
  return make_fn_kernel(fn, "cpu concat blocks, parts read through views");
}

// ---- pad -----------------------------------------------------------------------------------
struct PadPlan {
  int rank = 0;
  std::array<int64_t, kMaxDims> oext{}, ist{}, tab{};  // tab: where dim k's table starts in map
  std::vector<int64_t> map;  // per dim, per output index: the input index, or -1 for the fill value
  int64_t before = 0, width = 0, numel = 0;  // last dim: left pad and input extent
  int64_t lst = 1;                           // last dim: input stride (not 1 under input_perm)
  uint64_t fill = 0;                         // the fill value's bytes
};

template <typename T>
void pad_rows(const PadPlan& p, const T* in, T* out, int64_t rb, int64_t re) {
  const int last = p.rank - 1;
  const int64_t L = p.oext[size_t(last)];
  const int64_t* lmap = p.map.data() + p.tab[size_t(last)];
  T fill;
  std::memcpy(&fill, &p.fill, sizeof(T));
  for (int64_t r = rb; r < re; ++r) {
    T* dst = out + r * L;
    int64_t off = 0, rem = r;
    bool inside = true;
    for (int k = last - 1; k >= 0; --k) {
      const int64_t i = p.map[size_t(p.tab[size_t(k)] + rem % p.oext[size_t(k)])];
      rem /= p.oext[size_t(k)];
      inside = inside && i >= 0;
      off += i * p.ist[size_t(k)];
    }
    if (!inside) {
      std::fill(dst, dst + L, fill);
      continue;
    }
    const T* src = in + off;
    const int64_t st = p.lst;
    for (int64_t j = 0; j < p.before; ++j) dst[j] = lmap[j] < 0 ? fill : src[lmap[j] * st];
    if (st == 1) std::memcpy(dst + p.before, src, size_t(p.width) * sizeof(T));
    else for (int64_t j = 0; j < p.width; ++j) dst[p.before + j] = src[j * st];
    for (int64_t j = p.before + p.width; j < L; ++j) dst[j] = lmap[j] < 0 ? fill : src[lmap[j] * st];
  }
}

template <typename T>
struct Pad {
  static KernelFn make(std::shared_ptr<const PadPlan> p) {
    return [p](const void* const* in, void* const* out, const RunContext&) {
      if (p->numel == 0) return;
      const int64_t L = p->oext[size_t(p->rank - 1)];
      for_units(p->numel / L, L * int64_t(sizeof(T)), [&](int64_t b, int64_t e) {
        pad_rows<T>(*p, static_cast<const T*>(in[0]), static_cast<T*>(out[0]), b, e);
      });
    };
  }
};

std::unique_ptr<Kernel> make_pad(const Node& n, const Graph& g) {
  const TensorType& xt = g.type(n.inputs[0]);
  auto [x, xs] = pad_input(n, g);
  auto y = g.type(n.outputs[0]).shape();
  auto pads = n.attrs.get_ints("pads");
  if (x.empty()) x = y = xs = {1}, pads = {0, 0};  // a scalar: one unpadded element
  KILN_CHECK(x.size() <= size_t(kMaxDims), kUnsupported, op_name(n.op), ": rank ", x.size(),
             " exceeds the CPU kernel's limit of ", kMaxDims);
  const std::string mode = n.attrs.get_string("mode", "constant");
  auto p = std::make_shared<PadPlan>();
  p->rank = int(x.size());
  p->numel = g.type(n.outputs[0]).numel();
  for (size_t k = 0; k < x.size(); ++k) {
    p->oext[k] = y[k], p->ist[k] = xs[k], p->tab[k] = int64_t(p->map.size());
    for (int64_t o = 0; o < y[k]; ++o) {
      int64_t i = o - pads[2 * k];
      if (mode == "reflect") i = i < 0 ? -i : i >= x[k] ? 2 * (x[k] - 1) - i : i;
      else if (mode == "replicate") i = std::clamp<int64_t>(i, 0, x[k] - 1);
      else if (i >= x[k]) i = -1;
      p->map.push_back(i < 0 ? -1 : i);
    }
  }
  p->before = pads[2 * x.size() - 2], p->width = x.back(), p->lst = xs.back();
  store_double(&p->fill, xt.dtype, 0, mode == "constant" ? n.attrs.get_float("value", 0.0) : 0.0);
  return make_fn_kernel(by_size<Pad>(dtype_size(xt.dtype), std::shared_ptr<const PadPlan>(p)),
                        "cpu pad " + mode + " rows");
}

}  // namespace

std::unique_ptr<Kernel> make_shape_kernel(const Node& n, const Graph& g) {
  if (reads_input_in_order(n, g)) {  // reshape, copy, and views that keep the element order
    const int64_t bytes = int64_t(g.type(n.inputs[0]).nbytes());
    return make_fn_kernel([bytes](const void* const* in, void* const* out, const RunContext&) {
      if (out[0] == in[0]) return;  // aliased by the memory planner: the bytes are already there
      copy_bytes(out[0], in[0], bytes);
    }, std::string("cpu ") + op_name(n.op) + " memcpy");
  }
  switch (n.op) {
    case OpKind::kPermute:
    case OpKind::kExpand:
    case OpKind::kSlice: return make_strided(n, g);
    case OpKind::kConcat:
    case OpKind::kSplit: return make_concat_split(n, g);
    case OpKind::kPad: return make_pad(n, g);
    default: KILN_FAIL(kInternal, op_name(n.op), " is not in the shape family");
  }
}

}  // namespace kiln::cpu
