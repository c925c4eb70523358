// .npy reading and writing; see npy.h for what is supported and why bf16 travels as '<u2'.
//
// The header is a Python dict literal; the parser accepts exactly the literal forms NumPy
// writes (quoted keys and strings, True/False, tuples of integers) in any key order.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "kiln/errors.h"
#include "src/serialize/input_file.h"
#include "src/serialize/npy.h"

namespace kiln::npy {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;

struct DescrEntry {
  const char* descr;
  DType dtype;
};
constexpr DescrEntry kDescrs[] = {
    {"<f4", DType::kF32}, {"<f2", DType::kF16}, {"<f8", DType::kF64}, {"<i8", DType::kI64},
    {"<i4", DType::kI32}, {"|i1", DType::kI8},  {"|u1", DType::kU8},  {"|b1", DType::kBool},
    {"<u2", DType::kBF16},
};

// A cursor over the header text.
class HeaderParser {
 public:
  HeaderParser(std::string text, const std::string& what) : s_(std::move(text)), what_(what) {}

  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool accept(char c) {
    skip_ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c)) fail(std::string("expected '") + c + "'");
  }
  std::string string() {
    skip_ws();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) fail("expected a quoted string");
    char q = s_[i_++];
    size_t end = s_.find(q, i_);
    if (end == std::string::npos) fail("unterminated string");
    std::string out = s_.substr(i_, end - i_);
    i_ = end + 1;
    return out;
  }
  bool boolean() {
    skip_ws();
    for (auto [word, v] : {std::pair{"True", true}, {"False", false}}) {
      size_t n = std::strlen(word);
      if (s_.compare(i_, n, word) == 0) {
        i_ += n;
        return v;
      }
    }
    fail("expected True or False");
  }
  std::vector<int64_t> tuple() {
    expect('(');
    std::vector<int64_t> out;
    while (!accept(')')) {
      skip_ws();
      size_t start = i_;
      int64_t v = 0;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
        if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) fail("shape entry too large");
        v = v * 10 + (s_[i_++] - '0');
      }
      if (i_ == start) fail("expected a non-negative integer in the shape");
      out.push_back(v);
      if (!accept(',')) {
        expect(')');
        break;
      }
    }
    return out;
  }
  [[noreturn]] void fail(const std::string& why) const {
    KILN_FAIL(kInvalidArgument, "'", what_, "': bad .npy header (", why, " at character ", i_, "): ", s_);
  }

 private:
  std::string s_;
  size_t i_ = 0;
  const std::string& what_;
};

}  // namespace

const char* descr(DType t) {
  for (const auto& e : kDescrs)
    if (e.dtype == t) return e.descr;
  KILN_FAIL(kInternal, "no .npy descr for ", dtype_name(t));
}

Array parse(const uint8_t* data, size_t size, const std::string& what) {
  KILN_CHECK(size >= kMagicBytes + 4 && std::memcmp(data, kMagic, kMagicBytes) == 0, kInvalidArgument, "'", what,
             "' is not a .npy file (no \\x93NUMPY magic)");
  int major = data[6];
  size_t prefix = major == 1 ? 10 : 12;
  KILN_CHECK(major >= 1 && major <= 3, kInvalidArgument, "'", what, "': unsupported .npy format version ", major,
             ".", int(data[7]), " (supported: 1.0, 2.0, 3.0)");
  KILN_CHECK(size >= prefix, kInvalidArgument, "'", what, "': .npy file truncated in its header");
  size_t hlen = major == 1 ? size_t(data[8]) | size_t(data[9]) << 8
                           : size_t(data[8]) | size_t(data[9]) << 8 | size_t(data[10]) << 16 | size_t(data[11]) << 24;
  KILN_CHECK(hlen <= size - prefix, kInvalidArgument, "'", what, "': .npy header of ", hlen,
             " bytes runs past the end of the file");
  HeaderParser p(std::string(reinterpret_cast<const char*>(data + prefix), hlen), what);

  std::string descr_text;
  bool fortran = false, have_descr = false, have_order = false, have_shape = false;
  Array a;
  p.expect('{');
  while (!p.accept('}')) {
    std::string key = p.string();
    p.expect(':');
    if (key == "descr") {
      descr_text = p.string();
      have_descr = true;
    } else if (key == "fortran_order") {
      fortran = p.boolean();
      have_order = true;
    } else if (key == "shape") {
      a.shape = p.tuple();
      have_shape = true;
    } else {
      p.fail("unknown key '" + key + "'");
    }
    if (!p.accept(',')) {
      p.expect('}');
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape) p.fail("missing descr, fortran_order or shape");
  KILN_CHECK(!fortran, kInvalidArgument, "'", what,
             "' is stored in Fortran order; save it in C order (numpy: np.ascontiguousarray)");

  std::string d = descr_text;
  if (d.size() == 3 && (d[0] == '<' || d[0] == '=') && d[2] == '1') d[0] = '|';  // byte order is moot for 1 byte
  bool found = false;
  for (const auto& e : kDescrs)
    if (d == e.descr) {
      a.dtype = e.dtype;
      found = true;
    }
  KILN_CHECK(found, kInvalidArgument, "'", what, "' has dtype '", descr_text,
             (!descr_text.empty() && descr_text[0] == '>') ? "', big-endian data is not supported"
                                                           : "', which Kiln cannot read",
             "; supported: <f4 <f2 <f8 <i8 <i4 |i1 |u1 |b1, and <u2 as raw bfloat16 bits");

  size_t avail = size - prefix - hlen;
  size_t need = dtype_size(a.dtype);
  for (int64_t e : a.shape) {
    KILN_CHECK(e == 0 || need <= avail / size_t(e), kInvalidArgument, "'", what, "': shape needs more than the ",
               avail, " data bytes in the file");
    need *= size_t(e);
  }
  KILN_CHECK(need == avail, kInvalidArgument, "'", what, "' has ", avail, " data bytes, its shape and dtype need ",
             need);
  const uint8_t* body = data + prefix + hlen;
  a.data.assign(body, body + need);
  return a;
}

Bytes encode(DType dtype, const std::vector<int64_t>& shape, const void* data, size_t nbytes) {
  std::string dict = std::string("{'descr': '") + descr(dtype) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) dict += (i ? ", " : "") + std::to_string(shape[i]);
  dict += shape.size() == 1 ? ",), }" : "), }";
  // NumPy pads the header with spaces and a newline so that the data starts 64-byte aligned.
  bool v2 = dict.size() + 1 + 10 > 65535;
  size_t prefix = v2 ? 12 : 10;
  size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';
  Bytes out(kMagic, kMagic + kMagicBytes);
  out.push_back(v2 ? 2 : 1);
  out.push_back(0);
  size_t hlen = dict.size();
  for (size_t i = 0; i < (v2 ? 4u : 2u); ++i) out.push_back(uint8_t(hlen >> (8 * i)));
  out.insert(out.end(), dict.begin(), dict.end());
  const uint8_t* p = static_cast<const uint8_t*>(data);
  if (nbytes) out.insert(out.end(), p, p + nbytes);
  return out;
}

Array read_file(const std::string& path) {
  const serialize::InputFile file(path, ".npy file");
  const std::unique_ptr<uint8_t[]> bytes = file.read_all();
  return parse(bytes.get(), file.size(), path);
}

void write_file(const std::string& path, DType dtype, const std::vector<int64_t>& shape, const void* data,
                size_t nbytes) {
  Bytes bytes = encode(dtype, shape, data, nbytes);
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> f(std::fopen(path.c_str(), "wb"));
  if (!f) KILN_FAIL(kIo, "cannot write '", path, "': ", std::strerror(errno));
  if (std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size() || std::fflush(f.get()) != 0)
    KILN_FAIL(kIo, "cannot write '", path, "': ", std::strerror(errno));
}

}  // namespace kiln::npy
