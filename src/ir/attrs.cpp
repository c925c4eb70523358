// TensorType and Attrs: the small value types of the IR.
#include <sstream>

#include "kiln/errors.h"
#include "kiln/ir.h"

namespace kiln {

TensorType::TensorType(DType dt, const std::vector<int64_t>& shape) : dtype(dt) {
  dims.reserve(shape.size());
  for (int64_t e : shape) {
    Dim d;
    d.extent = e;
    dims.push_back(d);
  }
}

std::vector<int64_t> TensorType::shape() const {
  std::vector<int64_t> s;
  s.reserve(dims.size());
  for (const Dim& d : dims) s.push_back(d.extent);
  return s;
}

int64_t TensorType::numel() const {
  int64_t n = 1;
  for (const Dim& d : dims) n *= d.extent;
  return n;
}

std::string TensorType::to_string() const {
  std::ostringstream os;
  os << dtype_name(dtype) << "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) os << ",";
    const Dim& d = dims[i];
    if (d.is_static())
      os << d.extent;
    else
      os << d.symbol << "=" << d.extent << ":" << d.min << ".." << d.max;
  }
  os << "]";
  return os.str();
}

namespace {
template <typename T>
const T& typed(const std::map<std::string, AttrValue>& m, const std::string& key, const char* type_name) {
  auto it = m.find(key);
  KILN_CHECK(it != m.end(), kInvalidArgument, "missing attribute '", key, "'");
  const T* v = std::get_if<T>(&it->second);
  KILN_CHECK(v != nullptr, kInvalidArgument, "attribute '", key, "' is not of type ", type_name);
  return *v;
}
}  // namespace

int64_t Attrs::get_int(const std::string& key) const {
  auto it = map_.find(key);
  if (it != map_.end()) {
    if (auto* b = std::get_if<bool>(&it->second)) return *b ? 1 : 0;
  }
  return typed<int64_t>(map_, key, "int");
}
int64_t Attrs::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}
double Attrs::get_float(const std::string& key) const {
  auto it = map_.find(key);
  if (it != map_.end()) {
    if (auto* i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  }
  return typed<double>(map_, key, "float");
}
double Attrs::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}
bool Attrs::get_bool(const std::string& key) const { return typed<bool>(map_, key, "bool"); }
bool Attrs::get_bool(const std::string& key, bool fallback) const { return has(key) ? get_bool(key) : fallback; }
const std::string& Attrs::get_string(const std::string& key) const {
  return typed<std::string>(map_, key, "string");
}
std::string Attrs::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}
const std::vector<int64_t>& Attrs::get_ints(const std::string& key) const {
  return typed<std::vector<int64_t>>(map_, key, "int list");
}
std::vector<int64_t> Attrs::get_ints(const std::string& key, const std::vector<int64_t>& fallback) const {
  return has(key) ? get_ints(key) : fallback;
}
const std::vector<double>& Attrs::get_floats(const std::string& key) const {
  return typed<std::vector<double>>(map_, key, "float list");
}
DType Attrs::get_dtype(const std::string& key) const { return typed<DType>(map_, key, "dtype"); }
DType Attrs::get_dtype(const std::string& key, DType fallback) const {
  return has(key) ? get_dtype(key) : fallback;
}

}  // namespace kiln
