// NumPy .npy files: reading and writing dense C-order arrays of Kiln's dtypes (kiln-run's
// --inputs and --outputs).
//
// Supported: format versions 1.0, 2.0 and 3.0; descr '<f4' '<f2' '<f8' '<i8' '<i4' '|i1'
// '|u1' '|b1' (one-byte types also with '<' or '='). bfloat16 has no NumPy dtype: Kiln writes
// and reads it as '<u2' holding the raw bf16 bits (numpy: `a.view(np.uint16)`; torch:
// `t.view(torch.int16)`), so a '<u2' file is read as bf16. Rejected with a message naming the
// file: big-endian data, fortran_order True, other dtypes, a size that does not match the
// shape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/ir.h"

namespace kiln::npy {

struct Array {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  Bytes data;  // numel * dtype_size bytes, C order
};

const char* descr(DType t);  // "<f4", "|b1", "<u2" for bf16

// `what` names the source in messages (a path). Throws kInvalidArgument.
Array parse(const uint8_t* data, size_t size, const std::string& what);
Bytes encode(DType dtype, const std::vector<int64_t>& shape, const void* data, size_t nbytes);

// File I/O; kIo naming the path and the system's reason.
Array read_file(const std::string& path);
void write_file(const std::string& path, DType dtype, const std::vector<int64_t>& shape, const void* data,
                size_t nbytes);

}  // namespace kiln::npy
