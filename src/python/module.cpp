// kiln._C: the module, Kiln's exception classes and the conversions every binding file shares.
//
// kiln::Error -> Python. Each ErrorCode maps to one class; all derive from KilnError (a
// RuntimeError), and where a builtin says the same thing the class also derives from it, so
// callers can catch either:
//
//   kInvalidArgument  InvalidArgumentError (KilnError, ValueError)
//   kUnsupported      UnsupportedError     (KilnError, NotImplementedError)
//   kShapeMismatch    ShapeMismatchError   (KilnError, ValueError)
//   kTruncated        TruncatedError       (EngineFileError)    EngineFileError: a damaged or
//   kCorrupted        CorruptedError       (EngineFileError)    foreign engine file (KilnError)
//   kVersionMismatch  VersionMismatchError (EngineFileError)
//   kDeviceMismatch   DeviceMismatchError  (EngineFileError)
//   kIo               IoError              (KilnError, OSError)
//   kInternal         InternalError        (KilnError)
//
// The message is the C++ what() ("[code] cause"), bytes that are not UTF-8 replaced by U+FFFD so
// that the conversion never fails; the instance's `code` is the ErrorCode. Other C++ exceptions
// get nanobind's classes, with messages converted the same way.
// The classes are named kiln.X because the kiln package re-exports them (pickling finds them).
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstring>
#include <exception>
#include <future>
#include <new>
#include <stdexcept>

#include "kiln/backend.h"
#include "kiln/errors.h"
#include "src/python/bindings.h"
#include "src/serialize/byte_io.h"

namespace kiln::python {

void bind_build_info(nb::module_& m);  // build_info.cpp: fails the import on a second C++ runtime

namespace {

constexpr size_t kNumCodes = size_t(ErrorCode::kInternal) + 1;
std::array<PyObject*, kNumCodes> g_error_type{};  // owned by the module for the process lifetime

PyObject* new_exception(nb::module_& m, const char* name, const char* doc, std::initializer_list<PyObject*> bases) {
  nb::tuple base_tuple = nb::steal<nb::tuple>(PyTuple_New(Py_ssize_t(bases.size())));
  Py_ssize_t i = 0;
  for (PyObject* b : bases) PyTuple_SET_ITEM(base_tuple.ptr(), i++, nb::borrow(b).release().ptr());
  std::string qualified = std::string("kiln.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base_tuple.ptr(), nullptr);
  if (!type) throw nb::python_error();
  m.attr(name) = nb::borrow(type);
  return type;
}

// An exception's message as str; bytes that are not UTF-8 become U+FFFD rather than make the
// conversion fail, which would replace the real error with a conversion error.
nb::str message_text(const char* what) {
  PyObject* s = PyUnicode_DecodeUTF8(what, Py_ssize_t(std::strlen(what)), "replace");
  if (!s) {  // only when out of memory
    PyErr_Clear();
    return nb::str("(the error message could not be converted)");
  }
  return nb::steal<nb::str>(s);
}

// The Python class nanobind gives a standard C++ exception (its default translator's mapping).
PyObject* builtin_error_type(const std::exception& e) {
  if (dynamic_cast<const std::out_of_range*>(&e)) return PyExc_IndexError;
  if (dynamic_cast<const std::overflow_error*>(&e)) return PyExc_OverflowError;
  if (dynamic_cast<const std::domain_error*>(&e) || dynamic_cast<const std::invalid_argument*>(&e) ||
      dynamic_cast<const std::length_error*>(&e) || dynamic_cast<const std::range_error*>(&e))
    return PyExc_ValueError;
  return PyExc_RuntimeError;
}

void bind_errors(nb::module_& m) {
  nb::enum_<ErrorCode>(m, "ErrorCode", "What kind of failure a KilnError reports.")
      .value("invalid_argument", ErrorCode::kInvalidArgument)
      .value("unsupported", ErrorCode::kUnsupported)
      .value("shape_mismatch", ErrorCode::kShapeMismatch)
      .value("truncated", ErrorCode::kTruncated)
      .value("corrupted", ErrorCode::kCorrupted)
      .value("version_mismatch", ErrorCode::kVersionMismatch)
      .value("device_mismatch", ErrorCode::kDeviceMismatch)
      .value("io", ErrorCode::kIo)
      .value("internal", ErrorCode::kInternal);

  PyObject* base = new_exception(m, "KilnError", "Base class of every error raised by Kiln.", {PyExc_RuntimeError});
  PyObject* file = new_exception(m, "EngineFileError", "An engine file that cannot be loaded.", {base});
  auto& t = g_error_type;
  t[size_t(ErrorCode::kInvalidArgument)] = new_exception(
      m, "InvalidArgumentError", "A wrong option, attribute or argument.", {base, PyExc_ValueError});
  t[size_t(ErrorCode::kUnsupported)] = new_exception(
      m, "UnsupportedError", "A valid request Kiln cannot serve (op, dtype, device).", {base, PyExc_NotImplementedError});
  t[size_t(ErrorCode::kShapeMismatch)] = new_exception(
      m, "ShapeMismatchError", "Shapes that do not fit an op or an engine.", {base, PyExc_ValueError});
  t[size_t(ErrorCode::kTruncated)] = new_exception(m, "TruncatedError", "An engine file that ends early.", {file});
  t[size_t(ErrorCode::kCorrupted)] =
      new_exception(m, "CorruptedError", "An engine file whose bytes do not check out.", {file});
  t[size_t(ErrorCode::kVersionMismatch)] =
      new_exception(m, "VersionMismatchError", "An engine file from another format version.", {file});
  t[size_t(ErrorCode::kDeviceMismatch)] =
      new_exception(m, "DeviceMismatchError", "An engine built for another backend or device.", {file});
  t[size_t(ErrorCode::kIo)] =
      new_exception(m, "IoError", "A file that cannot be read or written.", {base, PyExc_OSError});
  t[size_t(ErrorCode::kInternal)] =
      new_exception(m, "InternalError", "A broken invariant inside Kiln (a bug: please report it).", {base});

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      size_t i = size_t(e.code());
      PyObject* type = i < kNumCodes ? g_error_type[i] : g_error_type[size_t(ErrorCode::kInternal)];
      nb::object exc = nb::steal(PyObject_CallOneArg(type, message_text(e.what()).ptr()));
      if (!exc.is_valid()) return;  // the constructor raised; that error stands
      if (PyObject_SetAttrString(exc.ptr(), "code", nb::cast(e.code()).ptr()) != 0) return;
      PyErr_SetObject(type, exc.ptr());
    } catch (const nb::python_error&) {
      throw;  // nanobind's own kinds pass on to its translator
    } catch (const nb::builtin_exception&) {
      throw;
    } catch (const std::bad_alloc&) {
      PyErr_NoMemory();
    } catch (const std::exception& e) {
      // Not Kiln's: nanobind's default would lose the message to a conversion error on bad bytes.
      PyErr_SetObject(builtin_error_type(e), message_text(e.what()).ptr());
    }
  });
}

}  // namespace

void* pointer_from_int(nb::handle h, const char* what) {
  if (!PyLong_Check(h.ptr()))
    KILN_FAIL(kInvalidArgument, what, " must be an int address, got ", nb::inst_name(h).c_str());
  void* p = PyLong_AsVoidPtr(h.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    KILN_FAIL(kInvalidArgument, what, " is not a valid address");
  }
  return p;
}

std::vector<int64_t> shape_from_sequence(nb::handle seq, const char* what) {
  if (!PySequence_Check(seq.ptr()) || PyUnicode_Check(seq.ptr()))
    KILN_FAIL(kInvalidArgument, what, " must be a sequence of ints, got ", nb::type_name(seq.type()).c_str());
  nb::object fast = nb::steal(PySequence_Fast(seq.ptr(), what));
  if (!fast.is_valid()) throw nb::python_error();
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast.ptr());
  PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (PyBool_Check(items[i]) || !PyIndex_Check(items[i]))
      KILN_FAIL(kInvalidArgument, what, "[", i, "] must be an int, got ", nb::inst_name(items[i]).c_str());
    int64_t v = PyLong_AsLongLong(items[i]);
    if (v == -1 && PyErr_Occurred()) throw nb::python_error();
    out[size_t(i)] = v;
  }
  return out;
}

BufferView::BufferView(nb::handle obj, const char* what) {
  if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_C_CONTIGUOUS) != 0) {
    PyErr_Clear();
    KILN_FAIL(kInvalidArgument, what, " must be a C-contiguous buffer (bytes, bytearray, numpy array), got ",
              nb::inst_name(obj).c_str());
  }
}

BufferView::~BufferView() { PyBuffer_Release(&view_); }

}  // namespace kiln::python

NB_MODULE(_C, m) {
  namespace kp = kiln::python;
  m.doc() = "Kiln core bindings: IR, builder, engine and runtime, ATen import.";
  m.attr("__version__") = KILN_VERSION;
  kp::bind_build_info(m);
  // PyTorch keeps Kiln objects alive until interpreter teardown (custom-op registrations, Dynamo's
  // compiled-code caches), so nanobind's exit-time leak report would only list those.
  nanobind::set_leak_warnings(false);
  kp::bind_errors(m);
  kp::bind_dtype(m);
  kp::bind_ir(m);
  kp::bind_builder(m);
  kp::bind_size_program(m);
  kp::bind_engine(m);
  kp::bind_import(m);
  kp::bind_refit(m);
  kp::bind_bundle(m);
  m.def("checksum64", [](nanobind::handle address, size_t nbytes) {
          const auto* p = static_cast<const uint8_t*>(kp::pointer_from_int(address, "address"));
          nanobind::gil_scoped_release release;
          return kiln::serialize::checksum64(p, nbytes);
        }, nanobind::arg("address"), nanobind::arg("nbytes"),
        nanobind::sig("def checksum64(address: int, nbytes: int) -> int"),
        "The engine file checksum (checksum64) of `nbytes` bytes at a host address: a fast fingerprint.");
  m.def("word_checksum", [](const std::string& device, const std::vector<std::pair<nanobind::handle, size_t>>& buffers,
                           nanobind::handle stream) {
          std::vector<kiln::Backend::Span> spans;
          for (const auto& [address, nbytes] : buffers)
            spans.push_back({nbytes ? kp::pointer_from_int(address, "address") : nullptr, nbytes});
          void* s = stream.is_none() ? nullptr : kp::pointer_from_int(stream, "stream");
          kiln::Backend& backend = kiln::get_backend(kiln::Device::parse(device));
          nanobind::gil_scoped_release release;
          return backend.checksum(spans, s);
        }, nanobind::arg("device"), nanobind::arg("buffers"), nanobind::arg("stream").none() = nanobind::none(),
        nanobind::sig("def word_checksum(device: str, buffers: Sequence[tuple[int, int]], stream: int | None = None) "
                      "-> int"),
        "The word checksum of (address, nbytes) buffers in `device`'s memory laid end to end, computed where "
        "they live, after the work queued on `stream` (a cudaStream_t as an int; None: the legacy default "
        "stream). Each buffer is padded with zeros to whole 8-byte words; word w at index i adds m ^ (m >> 29), "
        "m = (w ^ i * 0x5851F42D4C957F2D) * 0x2545F4914F6CDD1D, modulo 2**64.");
  m.def("set_timing_cache_path", &kiln::set_timing_cache_path, nanobind::arg("path"),
        "Where CUDA builds keep their timing cache file ($KILN_TIMING_CACHE, when set, wins).");
  m.def("cuda_available", [] { return kiln::backend_available(kiln::DeviceType::kCUDA); },
        "Whether this build has the CUDA backend and a CUDA device is present.");
  m.def("warm_up", [](const std::string& device) {
          const kiln::Device d = kiln::Device::parse(device);
          nanobind::gil_scoped_release release;
          std::future<std::string> done = kiln::get_backend(d).warm_up();
          return done.valid() ? done.get() : std::string();
        }, nanobind::arg("device"),
        "Sets up the libraries of `device`'s backend (CUDA: the upload lanes, the checksum, launch fence and graph fill kernels, cuBLASLt) "
        "once per process and says what it did and how long it took; '' when there was nothing to do or it was done before. Blocks.");
}
