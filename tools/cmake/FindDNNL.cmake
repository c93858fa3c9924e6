# Finder for oneDNN (Debian's libdnnl-dev 2.6). Its own package config is not
# used: it requires OpenCL's headers (the library's GPU runtime, only a
# Recommends of the package), which the CPU-only engine does not need.
# Creates DNNL::dnnl; DNNL_VERSION from dnnl_version.h.
find_path(DNNL_INCLUDE_DIR NAMES oneapi/dnnl/dnnl.hpp)
find_library(DNNL_LIBRARY NAMES dnnl)
if(DNNL_INCLUDE_DIR AND EXISTS "${DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h")
  file(STRINGS "${DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _dnnl_ver_lines
       REGEX "^#define DNNL_VERSION_(MAJOR|MINOR|PATCH) [0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define DNNL_VERSION_${_part} ([0-9]+).*" "\\1" _dnnl_${_part} "${_dnnl_ver_lines}")
  endforeach()
  set(DNNL_VERSION "${_dnnl_MAJOR}.${_dnnl_MINOR}.${_dnnl_PATCH}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(DNNL
  REQUIRED_VARS DNNL_LIBRARY DNNL_INCLUDE_DIR
  VERSION_VAR DNNL_VERSION)
if(DNNL_FOUND AND NOT TARGET DNNL::dnnl)
  add_library(DNNL::dnnl SHARED IMPORTED)
  set_target_properties(DNNL::dnnl PROPERTIES
    IMPORTED_LOCATION "${DNNL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${DNNL_INCLUDE_DIR}")
endif()
mark_as_advanced(DNNL_INCLUDE_DIR DNNL_LIBRARY)
