// kiln._C.build_info() and the import-time check that kiln._C shares the process's C++ runtime.
//
// PyTorch and the CUDA libraries use the platform's shared libstdc++. An extension linked
// against a private, static copy of it (a compiler with no shared libstdc++) frees memory that
// the other copy allocated and crashes far from the cause; cmake/cxx_runtime.cmake prevents
// that at build time, and this check turns any build that slipped through into an ImportError
// that names the cause, before anything can run.
#include <dlfcn.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <filesystem>
#include <stdexcept>
#include <string>

#include "kiln/backend.h"
#include "src/python/bindings.h"

namespace kiln::python {

namespace {

constexpr const char* kProbeSymbol = "_ZSt9terminatev";  // std::terminate(), in every C++ runtime

std::string real_path(const char* file) {
  std::error_code ec;
  auto p = std::filesystem::canonical(file, ec);
  return ec ? std::string(file) : p.string();
}

// The file holding std::terminate as the library behind `handle` resolves it ("" when it does
// not); closes the handle.
std::string runtime_file(void* handle) {
  std::string file;
  Dl_info info{};
  if (void* address = dlsym(handle, kProbeSymbol); address && dladdr(address, &info) && info.dli_fname)
    file = real_path(info.dli_fname);
  dlclose(handle);
  return file;
}

// The file that `library` (a path) resolves the C++ runtime from: itself when it carries its
// own copy, else the shared runtime among its dependencies; "" when it uses none.
std::string cxx_runtime_of(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (!handle) throw std::runtime_error("cannot open " + library + ": " + dlerror());
  return runtime_file(handle);
}

// The shared C++ runtime already loaded in this process, or "".
std::string process_cxx_runtime() {
  void* handle = dlopen("libstdc++.so.6", RTLD_LAZY | RTLD_NOLOAD);
  return handle ? runtime_file(handle) : std::string();
}

std::string this_library() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<const void*>(&this_library), &info) || !info.dli_fname) return {};
  return real_path(info.dli_fname);
}

void check_cxx_runtime(const std::string& library) {
  const std::string self = real_path(library.c_str());
  const std::string runtime = cxx_runtime_of(self);
  if (runtime.empty() || runtime == self)
    throw std::runtime_error(self +
                             " carries its own copy of the C++ runtime (libstdc++ linked statically); "
                             "beside the shared libstdc++ that PyTorch uses, two runtimes in one process crash");
  const std::string process = process_cxx_runtime();
  if (!process.empty() && process != runtime)
    throw std::runtime_error(self + " uses the C++ runtime " + runtime + ", but this process has " + process +
                             " loaded; two runtimes in one process crash");
}

}  // namespace

void bind_build_info(nb::module_& m) {
  const std::string self = this_library();
  try {
    if (!self.empty()) check_cxx_runtime(self);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string("kiln._C was built by ") + KILN_CXX_COMPILER + ": " + e.what() +
                             ". Rebuild Kiln with `pip install .`, which links the shared libstdc++ the "
                             "interpreter loads whatever the compiler (docs/install.md).");
  }
  m.def(
      "build_info",
      [self] {
        nb::dict info;
        info["compiler"] = KILN_CXX_COMPILER;
        info["library"] = self;
        info["cxx_runtime"] = cxx_runtime_of(self);
        info["process_cxx_runtime"] = process_cxx_runtime();
        nb::list libraries;
        for (const LibraryVersion& v : backend_library_versions()) {
          nb::dict d;
          d["name"] = v.name;
          d["built"] = v.built;
          d["loaded"] = v.loaded;
          d["file"] = v.file;
          libraries.append(d);
        }
        info["libraries"] = libraries;
        return info;
      },
      nb::sig("def build_info() -> dict[str, Any]"),
      "How this extension was built: the compiler, the C++ runtime it uses and the process's, and per "
      "backend library (CUDA: cudart, cublasLt, nvrtc, cudnn) the version built against, the version "
      "loaded and its file.");
  m.def("cxx_runtime_of", &cxx_runtime_of, nb::arg("library"),
        "The file a shared library resolves the C++ runtime from: itself when it carries a static copy, "
        "'' when it uses none.");
  m.def("check_cxx_runtime", &check_cxx_runtime, nb::arg("library"),
        "Raises RuntimeError when a shared library carries its own C++ runtime or uses another one than "
        "this process has loaded; the import of kiln._C runs it on itself.");
}

}  // namespace kiln::python
