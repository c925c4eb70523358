# Kiln's binaries link the C++ runtime that the Python interpreter loads, whatever the compiler.
#
# kiln._C shares its process with PyTorch, CUDA's libraries and others, which all use the
# platform's shared libstdc++.so.6. A compiler whose library folder has only libstdc++.a (a
# relocated GCC, for example) links a private copy of the runtime into the extension: two C++
# runtimes in one process, which free each other's memory and crash. So when the interpreter
# loads a shared libstdc++, a folder holding a libstdc++.so that points to it goes first on the
# link line (user -L folders precede the compiler's own), and a test program checks that this
# compiler's headers link against it. kiln._C checks again at import (src/python/runtime_check.cpp).
set(KILN_CXX_RUNTIME "" CACHE INTERNAL "The shared libstdc++ that Kiln's binaries link")
if(NOT CMAKE_SYSTEM_NAME STREQUAL "Linux" OR NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  return()
endif()
find_package(Python 3.9 COMPONENTS Interpreter QUIET)
if(NOT Python_Interpreter_FOUND)
  message(STATUS "Kiln: no Python interpreter found; the C++ runtime is the compiler's default")
  return()
endif()
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c [=[
import ctypes, os
ctypes.CDLL("libstdc++.so.6")
for line in open("/proc/self/maps"):
    parts = line.split()
    if len(parts) >= 6 and os.path.basename(parts[5]).startswith("libstdc++.so"):
        print(os.path.realpath(parts[5]), end="")
        break
]=]
  OUTPUT_VARIABLE _kiln_libstdcxx RESULT_VARIABLE _kiln_rc ERROR_QUIET)
if(NOT _kiln_rc EQUAL 0 OR NOT EXISTS "${_kiln_libstdcxx}")
  message(STATUS "Kiln: ${Python_EXECUTABLE} loads no shared libstdc++; the C++ runtime is the compiler's default")
  return()
endif()

set(_kiln_shim "${CMAKE_BINARY_DIR}/cxx-runtime")
file(MAKE_DIRECTORY "${_kiln_shim}")
file(CREATE_LINK "${_kiln_libstdcxx}" "${_kiln_shim}/libstdc++.so" SYMBOLIC)
set(_kiln_link_runtime "-L${_kiln_shim}")

# The compiler's headers may need a newer runtime than the platform's (a GCC newer than the
# system's): then every link would fail on versioned symbols, so say why once, here.
set(_kiln_probe "${CMAKE_BINARY_DIR}/cxx-runtime/probe.cpp")
file(WRITE "${_kiln_probe}" [=[
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
int main() {
  std::ostringstream s;
  s << std::string(40, 'x') << std::to_string(1.5);
  std::vector<std::unique_ptr<int>> v;
  v.push_back(std::make_unique<int>(1));
  std::thread t([] {});
  t.join();
  try { throw std::runtime_error(s.str()); } catch (const std::exception& e) { std::cout << e.what(); }
}
]=])
try_compile(_kiln_runtime_links "${CMAKE_BINARY_DIR}/cxx-runtime/check" SOURCES "${_kiln_probe}"
            CXX_STANDARD 20 LINK_OPTIONS ${_kiln_link_runtime} LINK_LIBRARIES Threads::Threads
            OUTPUT_VARIABLE _kiln_probe_log)
if(NOT _kiln_runtime_links)
  message(FATAL_ERROR
    "Kiln: ${CMAKE_CXX_COMPILER} (${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}) cannot link "
    "against ${_kiln_libstdcxx}, the C++ runtime that ${Python_EXECUTABLE} (and PyTorch in it) loads; "
    "its headers need a newer one. Build with a compiler no newer than the platform's, e.g. "
    "CXX=/usr/bin/g++. The link said:\n${_kiln_probe_log}")
endif()
add_link_options(${_kiln_link_runtime})
set(KILN_CXX_RUNTIME "${_kiln_libstdcxx}" CACHE INTERNAL "The shared libstdc++ that Kiln's binaries link")
message(STATUS "Kiln: C++ runtime ${_kiln_libstdcxx}")
