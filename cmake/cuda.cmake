# The CUDA backend: built when KILN_CUDA is ON, or AUTO and the CUDA libraries are found.
# It compiles src/backends/cuda/**.cpp into the core library (host code only: device code is
# generated at build time and compiled by NVRTC, so no .cu file and no CUDA language mode) and
# defines KILN_WITH_CUDA.
#
# Needed: the CUDA runtime, cuBLASLt, NVRTC and cuDNN 9, headers and libraries. Each library's
# header and binary are taken from one place, so that the version the headers declare is the
# version linked: first the NVIDIA wheels PyTorch installs (site-packages/nvidia/{cu13,cu12,
# cudnn,...}), whose copies are the ones a PyTorch process loads (one copy per soname), then
# the CUDA toolkit. kiln._C reports both versions and kiln checks them at import.
set(KILN_HAVE_CUDA OFF)
if(NOT KILN_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  set(_kiln_cuda_roots)  # include;lib pairs, flattened
  find_package(Python 3.9 COMPONENTS Interpreter QUIET)
  if(Python_Interpreter_FOUND)
    execute_process(
      COMMAND "${Python_EXECUTABLE}" -c "import nvidia, os; print(';'.join(os.path.join(p, s) for p in nvidia.__path__ for s in ('cu13', 'cu12', 'cudnn', 'cublas', 'cuda_nvrtc', 'cuda_runtime')))"
      OUTPUT_VARIABLE _kiln_wheel_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    foreach(d ${_kiln_wheel_dirs})
      list(APPEND _kiln_cuda_roots ${d}/include ${d}/lib)
    endforeach()
  endif()
  if(CUDAToolkit_FOUND)
    foreach(inc ${CUDAToolkit_INCLUDE_DIRS})
      list(APPEND _kiln_cuda_roots ${inc} ${CUDAToolkit_LIBRARY_DIR})
    endforeach()
  endif()
  list(APPEND _kiln_cuda_roots /usr/local/cuda/include /usr/local/cuda/lib64)
  list(LENGTH _kiln_cuda_roots _kiln_last_root)
  math(EXPR _kiln_last_root "${_kiln_last_root} - 1")

  # kiln_find_cuda_part(PREFIX "HEADERS" NAMES...): the first root with all the headers and one of
  # the library names sets KILN_<PREFIX>_INCLUDE and KILN_<PREFIX>_LIB. The wheels ship only
  # versioned sonames (libcublasLt.so.13), so those names are searched too.
  function(kiln_find_cuda_part prefix headers)
    list(GET headers 0 header)
    foreach(i RANGE 0 ${_kiln_last_root} 2)
      math(EXPR j "${i} + 1")
      list(GET _kiln_cuda_roots ${i} inc)
      list(GET _kiln_cuda_roots ${j} lib)
      set(complete TRUE)
      foreach(h ${headers})
        if(NOT EXISTS "${inc}/${h}")
          set(complete FALSE)
        endif()
      endforeach()
      if(complete)
        unset(_lib CACHE)
        find_library(_lib NAMES ${ARGN} PATHS "${lib}" NO_DEFAULT_PATH NO_CACHE)
        if(_lib)
          set(KILN_${prefix}_INCLUDE "${inc}" CACHE PATH "${header}'s folder" FORCE)
          set(KILN_${prefix}_LIB "${_lib}" CACHE FILEPATH "the library that goes with ${header}" FORCE)
          return()
        endif()
      endif()
    endforeach()
  endfunction()
  kiln_find_cuda_part(CUDART cuda_runtime.h cudart libcudart.so.13 libcudart.so.12)
  kiln_find_cuda_part(CUBLASLT cublasLt.h cublasLt libcublasLt.so.13 libcublasLt.so.12)
  kiln_find_cuda_part(NVRTC nvrtc.h nvrtc libnvrtc.so.13 libnvrtc.so.12)
  kiln_find_cuda_part(CUDNN cudnn.h cudnn libcudnn.so.9)
  # The runtime wheel's cuda_runtime.h comes without the compiler's headers it includes (crt/):
  # those come from wherever they are, after every library's own folder on the include path.
  set(_kiln_include_roots)
  foreach(i RANGE 0 ${_kiln_last_root} 2)
    list(GET _kiln_cuda_roots ${i} inc)
    list(APPEND _kiln_include_roots ${inc})
  endforeach()
  find_path(KILN_CUDA_CRT_INCLUDE crt/host_config.h PATHS ${_kiln_include_roots} NO_DEFAULT_PATH)

  set(_kiln_cuda_parts KILN_CUDART_INCLUDE KILN_CUBLASLT_INCLUDE KILN_NVRTC_INCLUDE KILN_CUDNN_INCLUDE KILN_CUDA_CRT_INCLUDE
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

file(GLOB_RECURSE KILN_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backends/cuda/*.cpp)
if(KILN_HAVE_CUDA AND KILN_CUDA_SOURCES)
  message(STATUS "Kiln: CUDA backend ON (${KILN_CUDART_LIB}, ${KILN_CUDNN_LIB})")
  target_sources(kiln PRIVATE ${KILN_CUDA_SOURCES})
  # Device code in .cuh files, embedded as strings that NVRTC compiles (codegen/embedded.h).
  file(GLOB KILN_CUDA_DEVICE_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backends/cuda/codegen/cuh/*.cuh)
  set(_kiln_embedded ${CMAKE_CURRENT_BINARY_DIR}/generated/embedded_cuda_sources.cpp)
  add_custom_command(
    OUTPUT ${_kiln_embedded}
    COMMAND ${CMAKE_COMMAND} -DOUTPUT=${_kiln_embedded} "-DSOURCES=${KILN_CUDA_DEVICE_SOURCES}"
            -P ${PROJECT_SOURCE_DIR}/cmake/embed_sources.cmake
    DEPENDS ${KILN_CUDA_DEVICE_SOURCES} ${PROJECT_SOURCE_DIR}/cmake/embed_sources.cmake
    COMMENT "Embedding CUDA device sources"
    VERBATIM)
  target_sources(kiln PRIVATE ${_kiln_embedded})
  target_compile_definitions(kiln PUBLIC KILN_WITH_CUDA=1)
  # PUBLIC in the build tree: the tests of the CUDA backend include its headers
  # (src/backends/cuda/**.h). The installed headers (include/kiln) include none of them.
  foreach(inc ${KILN_CUDART_INCLUDE} ${KILN_CUBLASLT_INCLUDE} ${KILN_NVRTC_INCLUDE} ${KILN_CUDNN_INCLUDE}
              ${KILN_CUDA_CRT_INCLUDE})
    target_include_directories(kiln SYSTEM PUBLIC $<BUILD_INTERFACE:${inc}>)
  endforeach()
  # The installed package links the same libraries through imported targets that its
  # KilnConfig.cmake makes where the consumer has them (cmake/install.cmake).
  foreach(part CUDART CUBLASLT NVRTC CUDNN)
    string(TOLOWER ${part} name)
    target_link_libraries(kiln PUBLIC $<BUILD_INTERFACE:${KILN_${part}_LIB}> $<INSTALL_INTERFACE:Kiln::${name}>)
  endforeach()
  # Installed binaries (kiln._C, kiln-run) find the libraries where the build found them; a
  # library in the interpreter's site-packages (a wheel's) also relative to kiln/, so that a
  # wheel built here works in another environment with the same wheels.
  set(_kiln_rpath)
  foreach(lib ${KILN_CUDART_LIB} ${KILN_CUBLASLT_LIB} ${KILN_NVRTC_LIB} ${KILN_CUDNN_LIB})
    get_filename_component(dir ${lib} DIRECTORY)
    string(FIND "${dir}" "${Python_SITEARCH}/" at)
    if(Python_SITEARCH AND at EQUAL 0)
      file(RELATIVE_PATH rel "${Python_SITEARCH}/kiln" "${dir}")
      list(APPEND _kiln_rpath "$ORIGIN/${rel}")
    endif()
    list(APPEND _kiln_rpath ${dir})
  endforeach()
  list(REMOVE_DUPLICATES _kiln_rpath)
  set(CMAKE_INSTALL_RPATH ${_kiln_rpath})
else()
  set(KILN_HAVE_CUDA OFF)
  message(STATUS "Kiln: CUDA backend OFF")
endif()
