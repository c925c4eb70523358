# Included before project(): a build folder honours the compiler that CXX names now.
#
# CMake detects the compiler once and keeps it in the folder's cache, and pip builds reuse one
# folder per wheel tag (pyproject.toml's build-dir), so a CXX set after the first build would be
# ignored without a word. When CXX names another compiler than the cached one, setting the cache
# entry makes CMake discard the folder's cache and configure again with the new compiler.
if(DEFINED CMAKE_CXX_COMPILER AND DEFINED ENV{CXX} AND NOT "$ENV{CXX}" STREQUAL "")
  separate_arguments(_kiln_env_cxx UNIX_COMMAND "$ENV{CXX}")
  list(GET _kiln_env_cxx 0 _kiln_env_cxx)
  find_program(_kiln_env_cxx_path NAMES "${_kiln_env_cxx}" NO_CACHE)
  if(_kiln_env_cxx_path)
    file(REAL_PATH "${_kiln_env_cxx_path}" _kiln_env_real)
    file(REAL_PATH "${CMAKE_CXX_COMPILER}" _kiln_cached_real)
    if(NOT _kiln_env_real STREQUAL _kiln_cached_real)
      message(STATUS "Kiln: CXX names ${_kiln_env_cxx_path}; this build folder was configured with "
                     "${CMAKE_CXX_COMPILER}: configuring again with the new compiler")
      set(CMAKE_CXX_COMPILER "${_kiln_env_cxx_path}" CACHE FILEPATH "C++ compiler" FORCE)
    endif()
  endif()
endif()
