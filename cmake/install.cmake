# Install rules: the C++ package and kiln-run.
#
# The package is the public headers (include/kiln), the core library (static: one file that
# kiln._C and kiln-run also link, so a consumer needs no library path at run time but the CUDA
# libraries') and a CMake package config with the target Kiln::kiln:
#
#   find_package(Kiln 0.1 REQUIRED)   # CMAKE_PREFIX_PATH: `python -m kiln.cmake_prefix`
#   target_link_libraries(app PRIVATE Kiln::kiln)
#
# In a wheel (scikit-build-core: SKBUILD) it lies inside the Python package, site-packages/kiln/
# {include,lib,lib/cmake/Kiln}, and kiln-run goes to the environment's scripts folder; a plain
# `cmake --install` uses the usual include/, lib/, lib/cmake/Kiln and bin/ under the prefix.
#
# Built with the CUDA backend, Kiln::kiln links the CUDA runtime, cuBLASLt, NVRTC and cuDNN
# (Kiln::cudart, Kiln::cublaslt, Kiln::nvrtc, Kiln::cudnn), which KilnConfig.cmake finds where
# the build found them: in a wheel, first at the same place relative to site-packages (the NVIDIA
# wheels PyTorch installs, in the consumer's environment), then at the build's absolute path.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(SKBUILD)
  set(KILN_INSTALL_INCLUDEDIR kiln/include)
  set(KILN_INSTALL_LIBDIR kiln/lib)
else()
  set(KILN_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR})
  set(KILN_INSTALL_LIBDIR ${CMAKE_INSTALL_LIBDIR})
endif()
set(KILN_INSTALL_CMAKEDIR ${KILN_INSTALL_LIBDIR}/cmake/Kiln)

target_include_directories(kiln PUBLIC $<INSTALL_INTERFACE:${KILN_INSTALL_INCLUDEDIR}>)
target_compile_features(kiln PUBLIC cxx_std_20)  # the headers are C++20 (std::span)
install(TARGETS kiln EXPORT KilnTargets ARCHIVE DESTINATION ${KILN_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kiln DESTINATION ${KILN_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(EXPORT KilnTargets NAMESPACE Kiln:: DESTINATION ${KILN_INSTALL_CMAKEDIR})

# The CUDA libraries for KilnConfig.cmake: "name;path relative to the install prefix (or '-');
# absolute path" per library. A path is relative only in a wheel and for a library inside the
# site-packages folder the wheel installs into (the prefix then).
set(KILN_CONFIG_CUDA_LIBRARIES "")
if(KILN_HAVE_CUDA)
  foreach(part CUDART CUBLASLT NVRTC CUDNN)
    string(TOLOWER ${part} name)
    set(lib "${KILN_${part}_LIB}")
    set(rel "-")
    if(SKBUILD AND Python_SITEARCH)
      string(FIND "${lib}" "${Python_SITEARCH}/" at)
      if(at EQUAL 0)
        file(RELATIVE_PATH rel "${Python_SITEARCH}" "${lib}")
      endif()
    endif()
    list(APPEND KILN_CONFIG_CUDA_LIBRARIES "${name}" "${rel}" "${lib}")
  endforeach()
endif()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/KilnConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/KilnConfig.cmake INSTALL_DESTINATION ${KILN_INSTALL_CMAKEDIR})
# Before 1.0 a minor version may change the API: only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/KilnConfigVersion.cmake VERSION ${PROJECT_VERSION}
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/KilnConfig.cmake ${PROJECT_BINARY_DIR}/KilnConfigVersion.cmake
        DESTINATION ${KILN_INSTALL_CMAKEDIR})

if(KILN_BUILD_TOOLS)
  if(SKBUILD)
    install(TARGETS kiln-run RUNTIME DESTINATION ${SKBUILD_SCRIPTS_DIR})
  else()
    install(TARGETS kiln-run RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endif()
