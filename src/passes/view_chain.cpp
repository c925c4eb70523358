// strided_view_of (view_chain.h): composes reshape, permute, slice and split nodes into one
// strided view of the value the chain starts from.
//
// Representation while composing: the current value's dims, each a row-major list of atoms
// (size, stride): index i of a dim is decomposed in mixed radix over its atoms' sizes and each
// digit steps its atom's stride. A dense value has one atom per dim (none for extent 1).
//   permute  moves the lists;
//   expand   gives each broadcast dim one atom of stride 0 (atom_view_of, when asked);
//   slice    offsets and strides the dim's only atom, or (step 1) its outermost atom when the
//            slice takes whole blocks of the inner atoms; otherwise the chain stops (output k of
//            a split is the step-1 slice after outputs 0..k-1);
//   reshape  flattens every atom in order, coalesces neighbours that are contiguous, and deals
//            the atoms out to the new dims, splitting one where a new dim ends inside it (the
//            split must divide its size; otherwise the chain stops).
// The chain is a view when at the end every dim has at most one atom. Chains are short (about
// ten nodes in a head split), so each start is tried from the furthest value inward and the
// first that gives a view wins: the longest chain.
#include <algorithm>
#include <set>

#include "src/ops/access.h"
#include "src/passes/view_chain.h"

namespace kiln::passes {

namespace {

using Atoms = std::vector<Atom>;

struct Layout {
  int64_t offset = 0;
  std::vector<Atoms> dims;
};

// Drops extent-1 atoms and merges an atom into its outer neighbour where they are contiguous.
Atoms coalesce(const Atoms& in) {
  Atoms out;
  for (const Atom& a : in) {
    if (a.size == 1) continue;
    if (!out.empty() && out.back().stride == a.size * a.stride) {
      out.back() = {out.back().size * a.size, a.stride};
    } else {
      out.push_back(a);
    }
  }
  return out;
}

Layout dense(const std::vector<int64_t>& shape) {
  Layout l;
  const std::vector<int64_t> st = row_major_strides(shape);
  for (size_t i = 0; i < shape.size(); ++i) l.dims.push_back(shape[i] == 1 ? Atoms{} : Atoms{{shape[i], st[i]}});
  return l;
}

bool apply_permute(Layout& l, const std::vector<int64_t>& perm) {
  if (perm.size() != l.dims.size()) return false;
  std::vector<Atoms> dims;
  for (int64_t p : perm) dims.push_back(l.dims[size_t(p)]);
  l.dims = std::move(dims);
  return true;
}

// Broadcasts to `shape` (right-aligned): a new or extent-1 dim becomes one atom of stride 0.
bool apply_expand(Layout& l, const std::vector<int64_t>& in, const std::vector<int64_t>& shape) {
  if (shape.size() < in.size() || l.dims.size() != in.size()) return false;
  std::vector<Atoms> dims(shape.size());
  const size_t lead = shape.size() - in.size();
  for (size_t i = 0; i < shape.size(); ++i) {
    const bool broadcast = i < lead || (in[i - lead] == 1 && shape[i] != 1);
    if (broadcast && shape[i] != 1) dims[i] = {{shape[i], 0}};
    if (!broadcast) dims[i] = l.dims[i - lead];
  }
  l.dims = std::move(dims);
  return true;
}

// Keeps `count` indices start, start + step, ... of dim `axis`.
bool apply_slice(Layout& l, size_t axis, int64_t start, int64_t step, int64_t count) {
  if (axis >= l.dims.size() || count < 1) return false;
  Atoms a = coalesce(l.dims[axis]);
  if (count == 1) {  // a single index: its offset, and the dim has extent 1
    for (size_t i = a.size(); i-- > 0;) {
      l.offset += (start % a[i].size) * a[i].stride;
      start /= a[i].size;
    }
    l.dims[axis] = {};
    return true;
  }
  if (a.empty()) return false;
  if (a.size() == 1) {
    l.offset += start * a[0].stride;
    l.dims[axis] = {{count, a[0].stride * step}};
    return true;
  }
  int64_t inner = 1;
  for (size_t i = 1; i < a.size(); ++i) inner *= a[i].size;
  if (step != 1 || start % inner != 0 || count % inner != 0) return false;
  l.offset += (start / inner) * a[0].stride;
  a[0].size = count / inner;
  l.dims[axis] = a;
  return true;
}

bool apply_reshape(Layout& l, const std::vector<int64_t>& shape) {
  Atoms flat;
  for (const Atoms& d : l.dims) flat.insert(flat.end(), d.begin(), d.end());
  flat = coalesce(flat);
  size_t next = 0;
  std::vector<Atoms> dims;
  for (int64_t extent : shape) {
    Atoms d;
    int64_t need = extent;
    while (need > 1) {
      if (next == flat.size()) return false;
      Atom& a = flat[next];
      if (need % a.size == 0) {  // the whole atom
        d.push_back(a);
        need /= a.size;
        ++next;
      } else if (a.size % need == 0) {  // its outer part; the inner part stays for the next dim
        d.push_back({need, a.stride * (a.size / need)});
        a.size /= need;
        need = 1;
      } else {
        return false;
      }
    }
    dims.push_back(std::move(d));
  }
  if (next != flat.size()) return false;
  l.dims = std::move(dims);
  return true;
}

// Turns `l`, the layout of node n's input, into that of its output `out`; false where the chain
// stops.
bool apply(Layout& l, const Node& n, const Graph& g, ValueId out) {
  switch (n.op) {
    case OpKind::kPermute: return apply_permute(l, n.attrs.get_ints("perm"));
    case OpKind::kExpand: return apply_expand(l, g.type(n.inputs[0]).shape(), g.type(out).shape());
    case OpKind::kReshape: return apply_reshape(l, g.type(out).shape());
    case OpKind::kSlice: {
      const int64_t step = n.attrs.get_int("step");
      const size_t axis = size_t(n.attrs.get_int("axis"));
      return step > 0 && apply_slice(l, axis, n.attrs.get_int("start"), step, g.type(out).shape()[axis]);
    }
    case OpKind::kSplit: {
      const size_t axis = size_t(n.attrs.get_int("axis"));
      int64_t start = 0;
      for (size_t k = 0; k < n.outputs.size() && n.outputs[k] != out; ++k) start += g.type(n.outputs[k]).shape()[axis];
      return apply_slice(l, axis, start, 1, g.type(out).shape()[axis]);
    }
    default: return false;
  }
}

bool is_view_op(const Node* n, bool through_expand) {
  return n != nullptr &&
         (n->op == OpKind::kSplit ||
          (n->outputs.size() == 1 && (n->op == OpKind::kPermute || n->op == OpKind::kReshape ||
                                      n->op == OpKind::kSlice || (through_expand && n->op == OpKind::kExpand))));
}

ValueView trivial(const Graph& g, ValueId v) {
  ValueView r;
  r.base = v;
  r.sizes = g.type(v).shape();
  r.strides = row_major_strides(r.sizes);
  for (size_t i = 0; i < r.sizes.size(); ++i)
    if (r.sizes[i] == 1) r.strides[i] = 0;
  return r;
}

// The common refinement of factorizations (outermost first) of one extent: the sizes between
// the cut points of any, or empty when a cut of one falls inside a factor of another without
// dividing it.
std::vector<int64_t> refine(const std::vector<Atoms>& sides, int64_t extent) {
  std::set<int64_t> cuts = {1};  // products of the outer factors of a side
  for (const Atoms& atoms : sides) {
    int64_t p = extent;
    for (const Atom& a : atoms) cuts.insert(p /= a.size);
  }
  std::vector<int64_t> sizes;
  int64_t inner = 1;
  for (int64_t c : cuts) {  // ascending: the innermost cut first
    if (c == 1) continue;
    if (c % inner != 0) return {};
    sizes.insert(sizes.begin(), c / inner);
    inner = c;
  }
  if (extent % inner != 0) return {};
  if (extent / inner > 1 || sizes.empty()) sizes.insert(sizes.begin(), extent / inner);
  return sizes;
}

// `atoms` (of a dim of the refined `sizes`' product) split into one atom per refined size.
Atoms split_atoms(const Atoms& atoms, const std::vector<int64_t>& sizes) {
  Atoms out;
  size_t next = 0;
  for (const Atom& a : atoms) {
    int64_t left = a.size;
    while (left > 1) {
      const int64_t s = sizes[next++];
      left /= s;
      out.push_back({s, a.stride * left});
    }
  }
  while (out.size() < sizes.size()) out.push_back({sizes[out.size()], 0});  // extent-1 refined dims
  return out;
}

}  // namespace

bool ValueView::whole_base(const Graph& g) const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  if (offset != 0 || n != g.type(base).numel()) return false;
  const std::vector<int64_t> st = row_major_strides(sizes);
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] != 1 && strides[i] != st[i]) return false;
  return true;
}

bool AtomView::in_order(const Graph& g) const {
  Atoms flat;
  for (const Atoms& d : dims) flat.insert(flat.end(), d.begin(), d.end());
  flat = coalesce(flat);
  const int64_t n = g.type(base).numel();
  return offset == 0 && (n == 1 ? flat.empty() : flat.size() == 1 && flat[0].size == n && flat[0].stride == 1);
}

AtomView atom_view_of(const Graph& g, ValueId v, bool through_expand,
                      const std::function<bool(const AtomView&)>& accept) {
  constexpr size_t kMaxChain = 64;
  // chain[i + 1] is the input of the node producing chain[i].
  std::vector<ValueId> chain = {v};
  std::vector<const Node*> ops;
  while (chain.size() <= kMaxChain) {
    const Node* p = g.value(chain.back()).producer;
    if (!is_view_op(p, through_expand)) break;
    ops.push_back(p);
    chain.push_back(p->inputs[0]);
  }
  auto view_from = [&](size_t start, const Layout& l) {
    AtomView r;
    r.base = chain[start];
    r.offset = l.offset;
    for (const Atoms& d : l.dims) r.dims.push_back(coalesce(d));
    return r;
  };
  if (g.type(v).numel() != 0) {
    for (size_t start = chain.size() - 1; start >= 1; --start) {
      if (g.type(chain[start]).numel() == 0) continue;
      Layout l = dense(g.type(chain[start]).shape());
      bool ok = true;
      for (size_t i = start; ok && i-- > 0;) ok = apply(l, *ops[i], g, chain[i]);
      if (!ok) continue;
      AtomView r = view_from(start, l);
      if (accept(r)) return r;
    }
  }
  return view_from(0, dense(g.type(v).shape()));
}

ValueView strided_view_of(const Graph& g, ValueId v) {
  if (g.type(v).numel() == 0) return trivial(g, v);
  auto single = [](const AtomView& a) {
    return std::all_of(a.dims.begin(), a.dims.end(), [](const Atoms& d) { return d.size() <= 1; });
  };
  const AtomView a = atom_view_of(g, v, false, single);
  if (a.base == v) return trivial(g, v);
  ValueView r;
  r.base = a.base;
  r.offset = a.offset;
  r.sizes = g.type(v).shape();
  for (const Atoms& d : a.dims) r.strides.push_back(d.empty() ? 0 : d[0].stride);
  return r;
}

std::optional<RefinedBatches> refine_batches(const std::vector<const AtomView*>& operands,
                                             const std::vector<int64_t>& batch) {
  RefinedBatches r;
  r.atoms.resize(operands.size());
  for (size_t d = 0; d < batch.size(); ++d) {
    std::vector<Atoms> sides;
    std::vector<size_t> side_of;
    for (size_t i = 0; i < operands.size(); ++i) {
      const std::vector<Atoms>& dims = operands[i]->dims;
      const size_t lead = batch.size() - (dims.size() - 2);
      if (d >= lead && !dims[d - lead].empty()) sides.push_back(dims[d - lead]), side_of.push_back(i);
    }
    std::vector<int64_t> refined = refine(sides, batch[d]);
    if (refined.empty()) return std::nullopt;
    for (size_t i = 0; i < operands.size(); ++i) {
      const auto it = std::find(side_of.begin(), side_of.end(), i);
      if (it == side_of.end()) {  // no such dim, or extent 1: broadcast
        r.atoms[i].insert(r.atoms[i].end(), refined.size(), Atom{1, 0});
      } else {
        const Atoms split = split_atoms(sides[size_t(it - side_of.begin())], refined);
        r.atoms[i].insert(r.atoms[i].end(), split.begin(), split.end());
      }
    }
    r.groups.push_back(std::move(refined));
  }
  return r;
}

RefinedOperand refined_operand(const Graph& g, ValueId operand, const AtomView& v, const std::vector<Atom>& batch) {
  const std::vector<int64_t> shape = g.type(operand).shape();
  RefinedOperand r;
  for (const Atom& a : batch) r.shape.push_back(a.size), r.strides.push_back(a.size == 1 ? 0 : a.stride);
  for (size_t d = shape.size() - 2; d < shape.size(); ++d)
    r.shape.push_back(shape[d]), r.strides.push_back(v.dims[d].empty() ? 0 : v.dims[d][0].stride);
  return r;
}

std::vector<int64_t> view_attribute(int64_t offset, const std::vector<int64_t>& sizes,
                                    const std::vector<int64_t>& strides) {
  std::vector<int64_t> a = {offset};
  for (size_t d = 0; d < sizes.size(); ++d) a.push_back(sizes[d]), a.push_back(strides[d]);
  return a;
}

}  // namespace kiln::passes
