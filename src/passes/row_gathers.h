// Row gathers: data movement that keeps runs of innermost elements (rows) whole, written as one
// index_select along the rows instead of a chain of copies (row_gathers.cpp).
//
// A chain of reshapes and permutes that is no strided view of its start (MaxViT's window
// partition read back as a grid: H = 56 split as 8 x 7, then as 7 x 8) costs a copy per
// permute. Where the chain moves whole rows of contiguous elements, the source row of every
// output row is a constant: x seen as [lead, rows, width] and index_select(x, 1, index) seen in
// the output's shape do what the chain does, reading and writing each row once, in 16-byte words.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/ir.h"

namespace kiln::passes {

// The source seen as [lead, rows, width]: output row k of block q is row index[k] of block q.
struct RowGather {
  int64_t lead = 1;
  int64_t rows = 0;   // source rows per block
  int64_t width = 0;  // elements per row
  std::vector<int64_t> index;

  bool identity() const;
};

// Rows worth gathering: a whole number of 16-byte words each.
bool gatherable_row(int64_t width, DType dt);

// reshape(permute(v, P), S) as a row gather of v followed by a permute, where rows of v's
// innermost dim survive the permute and the reshape inside one dim d of S: the gather writes S
// with dim d moved last (`z`), and permute(z, `perm`) is the reshape's result.
struct PermutedRows {
  RowGather gather;
  std::vector<int64_t> z;
  std::vector<int64_t> perm;
};
std::optional<PermutedRows> rows_through(const std::vector<int64_t>& vs, const std::vector<int64_t>& p,
                                         const std::vector<int64_t>& s, DType dt);

// Inserts x as [lead, rows, width] and its index_select by `rows` before `pos` (which
// advances); returns the gathered [lead, rows, width] value (x's reshape alone when the gather
// moves nothing).
ValueId insert_row_gather(Graph& g, size_t& pos, ValueId x, const RowGather& rows, const std::string& name);

}  // namespace kiln::passes
