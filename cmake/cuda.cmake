# The CUDA backend: built when KILN_CUDA is ON, or AUTO and the CUDA libraries are found.
# It compiles src/backends/cuda/*.cpp into the core library (host code only: device code is
# generated at build time and compiled by NVRTC, so no .cu file and no CUDA language mode) and
# defines KILN_WITH_CUDA.
#
# Needed: the CUDA runtime, cuBLASLt, NVRTC and cuDNN 9, headers and libraries. They are
# searched in the CUDA toolkit and in the NVIDIA wheels PyTorch installs
# (site-packages/nvidia/{cu13,cu12,cudnn}/), which is where cuDNN usually is.
set(KILN_HAVE_CUDA OFF)
if(NOT KILN_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  set(_kiln_cuda_hints)
  if(CUDAToolkit_FOUND)
    list(APPEND _kiln_cuda_hints ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_DIR})
  endif()
  find_package(Python 3.9 COMPONENTS Interpreter QUIET)
  if(Python_Interpreter_FOUND)
    execute_process(
      COMMAND "${Python_EXECUTABLE}" -c "import nvidia, os; print(';'.join(os.path.join(p, s) for p in nvidia.__path__ for s in ('cu13', 'cu12', 'cudnn', 'cublas', 'cuda_nvrtc', 'cuda_runtime')))"
      OUTPUT_VARIABLE _kiln_wheel_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    foreach(d ${_kiln_wheel_dirs})
      list(APPEND _kiln_cuda_hints ${d}/include ${d}/lib)
    endforeach()
  endif()
  list(APPEND _kiln_cuda_hints /usr/local/cuda/include /usr/local/cuda/lib64)

  find_path(KILN_CUDART_INCLUDE cuda_runtime.h HINTS ${_kiln_cuda_hints})
  find_path(KILN_CUBLASLT_INCLUDE cublasLt.h HINTS ${_kiln_cuda_hints})
  find_path(KILN_NVRTC_INCLUDE nvrtc.h HINTS ${_kiln_cuda_hints})
  find_path(KILN_CUDNN_INCLUDE cudnn.h HINTS ${_kiln_cuda_hints})
  # The wheels ship only versioned sonames (libcublasLt.so.13), so those names are searched too.
  find_library(KILN_CUDART_LIB NAMES cudart libcudart.so.13 libcudart.so.12 HINTS ${_kiln_cuda_hints})
  find_library(KILN_CUBLASLT_LIB NAMES cublasLt libcublasLt.so.13 libcublasLt.so.12 HINTS ${_kiln_cuda_hints})
  find_library(KILN_NVRTC_LIB NAMES nvrtc libnvrtc.so.13 libnvrtc.so.12 HINTS ${_kiln_cuda_hints})
  find_library(KILN_CUDNN_LIB NAMES cudnn libcudnn.so.9 HINTS ${_kiln_cuda_hints})

  set(_kiln_cuda_parts KILN_CUDART_INCLUDE KILN_CUBLASLT_INCLUDE KILN_NVRTC_INCLUDE KILN_CUDNN_INCLUDE
                       KILN_CUDART_LIB KILN_CUBLASLT_LIB KILN_NVRTC_LIB KILN_CUDNN_LIB)
  set(_kiln_cuda_missing)
  foreach(v ${_kiln_cuda_parts})
    if(NOT ${v})
      list(APPEND _kiln_cuda_missing ${v})
    endif()
  endforeach()
  if(NOT _kiln_cuda_missing)
    set(KILN_HAVE_CUDA ON)
  elseif(KILN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KILN_CUDA=ON but these CUDA parts were not found: ${_kiln_cuda_missing}")
  else()
    message(STATUS "Kiln: CUDA parts not found (${_kiln_cuda_missing})")
  endif()
endif()

file(GLOB KILN_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backends/cuda/*.cpp)
if(KILN_HAVE_CUDA AND KILN_CUDA_SOURCES)
  message(STATUS "Kiln: CUDA backend ON (${KILN_CUDART_LIB}, ${KILN_CUDNN_LIB})")
  target_sources(kiln PRIVATE ${KILN_CUDA_SOURCES})
  target_compile_definitions(kiln PUBLIC KILN_WITH_CUDA=1)
  # PUBLIC: the tests of the CUDA backend include its headers (src/backends/cuda/*.h).
  target_include_directories(kiln SYSTEM PUBLIC ${KILN_CUDART_INCLUDE} ${KILN_CUBLASLT_INCLUDE}
                             ${KILN_NVRTC_INCLUDE} ${KILN_CUDNN_INCLUDE})
  target_link_libraries(kiln PUBLIC ${KILN_CUDART_LIB} ${KILN_CUBLASLT_LIB} ${KILN_NVRTC_LIB} ${KILN_CUDNN_LIB})
  # Installed binaries (kiln._C, kiln-run) find the libraries where the build found them.
  set(_kiln_rpath)
  foreach(lib ${KILN_CUDART_LIB} ${KILN_CUBLASLT_LIB} ${KILN_NVRTC_LIB} ${KILN_CUDNN_LIB})
    get_filename_component(dir ${lib} DIRECTORY)
    list(APPEND _kiln_rpath ${dir})
  endforeach()
  list(REMOVE_DUPLICATES _kiln_rpath)
  set(CMAKE_INSTALL_RPATH ${_kiln_rpath})
else()
  set(KILN_HAVE_CUDA OFF)
  message(STATUS "Kiln: CUDA backend OFF")
endif()
