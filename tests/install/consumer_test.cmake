# Installs a built fedwan tree into a scratch prefix, checks what was
# installed, then configures, builds and runs examples/consumer against that
# prefix as a separate project. Any failing step fails the script.
#
#   cmake -DFEDWAN_BUILD_DIR=<built tree> -DFEDWAN_SOURCE_DIR=<source tree>
#         -DCONSUMER_SOURCE_DIR=<examples/consumer> -DSCRATCH_DIR=<dir>
#         [-DBUILD_TYPE=Release] [-DCXX_COMPILER=...] [-DCXX_LAUNCHER=ccache]
#         [-DTorch_DIR=...] [-DPREFIX_PATH=a|b] -P consumer_test.cmake
#
# SCRATCH_DIR holds the prefix and the consumer's build tree. Keep it fixed:
# `cmake --install` keeps the files' times, so a re-run recompiles only what
# changed.
cmake_minimum_required(VERSION 3.18)

foreach(var FEDWAN_BUILD_DIR FEDWAN_SOURCE_DIR CONSUMER_SOURCE_DIR SCRATCH_DIR)
  if(NOT ${var})
    message(FATAL_ERROR "consumer_test.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()

set(prefix ${SCRATCH_DIR}/prefix)
set(consumer_build ${SCRATCH_DIR}/consumer-build)
set(headers_src ${SCRATCH_DIR}/headers-src)
set(headers_build ${SCRATCH_DIR}/headers-build)

# Runs one step; on failure prints its output and stops. `echo` prints the
# output on success as well.
function(run_step name echo)
  list(JOIN ARGN " " shown)
  message(STATUS "[${name}] ${shown}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out
                  TIMEOUT 500)
  if(NOT rc EQUAL 0)
    message("${out}")
    message(FATAL_ERROR "[${name}] failed (${rc})")
  endif()
  if(echo)
    message("${out}")
  endif()
endfunction()

# Configure arguments shared by the two projects built against the prefix.
# Only the scratch prefix may provide fedwan: no package registry, and the
# prefix comes before the paths fedwan itself was configured with.
set(prefix_path ${prefix})
if(PREFIX_PATH)
  string(REPLACE "|" ";" extra "${PREFIX_PATH}")
  list(APPEND prefix_path ${extra})
endif()
# The list travels in the environment (':'-separated), where no layer of
# argument passing can split it: split, "-DCMAKE_PREFIX_PATH=<prefix>" would
# lose the rest, and the consumer would find another LibTorch (the system's)
# than the one fedwan was built with.
string(REPLACE ";" ":" prefix_path_env "${prefix_path}")
set(configure_env ${CMAKE_COMMAND} -E env "CMAKE_PREFIX_PATH=${prefix_path_env}")
set(configure_args
  -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
# And LibTorch itself is the one fedwan was built with, whatever else the
# paths hold.
if(NOT Torch_DIR AND EXISTS ${FEDWAN_BUILD_DIR}/CMakeCache.txt)
  file(STRINGS ${FEDWAN_BUILD_DIR}/CMakeCache.txt cached REGEX "^Torch_DIR:")
  string(REGEX REPLACE "^Torch_DIR:[A-Z]+=" "" Torch_DIR "${cached}")
  if(NOT IS_DIRECTORY "${Torch_DIR}")
    set(Torch_DIR "")
  endif()
endif()
if(CXX_COMPILER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
if(CXX_LAUNCHER)
  list(APPEND configure_args -DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_LAUNCHER})
endif()
if(Torch_DIR)
  list(APPEND configure_args -DTorch_DIR=${Torch_DIR})
endif()

# The Torch_DIR a build tree under SCRATCH_DIR was configured with ("" if none).
function(cached_torch_dir build out)
  set(value "")
  if(EXISTS ${build}/CMakeCache.txt)
    file(STRINGS ${build}/CMakeCache.txt line REGEX "^Torch_DIR:")
    string(REGEX REPLACE "^Torch_DIR:[A-Z]+=" "" value "${line}")
  endif()
  set(${out} "${value}" PARENT_SCOPE)
endfunction()
# Trees configured against another LibTorch keep its other paths cached
# (Caffe2_DIR, ...): start them afresh.
foreach(tree ${consumer_build} ${headers_build})
  cached_torch_dir(${tree} was)
  if(Torch_DIR AND was AND NOT was STREQUAL Torch_DIR)
    file(REMOVE_RECURSE ${tree})
  endif()
endforeach()

# 1. Install into a fresh prefix, so nothing stale from an earlier run (a
#    header since removed) can mask a missing file.
file(REMOVE_RECURSE ${prefix})
run_step(install OFF ${CMAKE_COMMAND} --install ${FEDWAN_BUILD_DIR} --prefix ${prefix}
         --config ${BUILD_TYPE})

# 2. The installed package must not point back into the source or build
#    tree: it would work here and break on every other machine.
file(GLOB package_files ${prefix}/lib*/cmake/fedwan/*.cmake)
if(NOT package_files)
  message(FATAL_ERROR "[check] no package config under ${prefix}/lib*/cmake/fedwan")
endif()
foreach(f ${package_files})
  file(READ ${f} text)
  string(REPLACE "${prefix}" "" text "${text}")
  foreach(tree ${FEDWAN_SOURCE_DIR} ${FEDWAN_BUILD_DIR})
    string(FIND "${text}" "${tree}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "[check] ${f} refers to ${tree}; installed files must use "
                          "install-relative paths ($<INSTALL_INTERFACE:...>)")
    endif()
  endforeach()
endforeach()

# 3. Installed binaries find fedwan's own libraries next to them (RUNPATH
#    $ORIGIN), whatever links or dlopens them. Needs ldd; skipped without.
find_program(ldd ldd)
file(GLOB binaries ${prefix}/lib*/libfedwan*.so* ${prefix}/bin/*)
if(ldd)
  foreach(b ${binaries})
    if(IS_SYMLINK ${b})
      continue()
    endif()
    execute_process(COMMAND ${ldd} ${b} OUTPUT_VARIABLE deps ERROR_QUIET)
    string(REGEX MATCH "libfedwan[^ ]* => not found" missing "${deps}")
    if(missing)
      message(FATAL_ERROR "[check] ${b}: ${missing}; give the target "
                          "INSTALL_RPATH \"$ORIGIN\" (bin/: \"$ORIGIN/../lib\")")
    endif()
  endforeach()
endif()

# 4. Every installed header compiles on its own with only installed include
#    paths (no private header of src/ reachable). One file per header;
#    rewritten only when it changes, so re-runs are incremental.
file(GLOB headers RELATIVE ${prefix}/include ${prefix}/include/fedwan/*.h
     ${prefix}/include/fedwan/*.hpp)
set(sources "")
foreach(h ${headers})
  string(MAKE_C_IDENTIFIER ${h} stem)
  file(WRITE ${SCRATCH_DIR}/tmp.cpp "#include <${h}>\n")
  configure_file(${SCRATCH_DIR}/tmp.cpp ${headers_src}/${stem}.cpp COPYONLY)
  list(APPEND sources ${stem}.cpp)
endforeach()
file(WRITE ${SCRATCH_DIR}/tmp.cpp
  "cmake_minimum_required(VERSION 3.18)\n"
  "project(fedwan_headers LANGUAGES CXX)\n"
  "find_package(fedwan REQUIRED)\n"
  "add_library(headers OBJECT ${sources})\n"
  "target_compile_features(headers PRIVATE cxx_std_17)\n"
  "target_link_libraries(headers PRIVATE fedwan::fedwan)\n")
configure_file(${SCRATCH_DIR}/tmp.cpp ${headers_src}/CMakeLists.txt COPYONLY)
file(REMOVE ${SCRATCH_DIR}/tmp.cpp)
run_step(headers-configure OFF ${configure_env} ${CMAKE_COMMAND} -S ${headers_src}
         -B ${headers_build} ${configure_args})
run_step(headers-build OFF ${CMAKE_COMMAND} --build ${headers_build} --config ${BUILD_TYPE})

# 5. The example, configured exactly as a user would: find_package(fedwan).
run_step(configure OFF ${configure_env} ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR}
         -B ${consumer_build} ${configure_args})
cached_torch_dir(${consumer_build} found_torch)
if(Torch_DIR AND NOT found_torch STREQUAL Torch_DIR)
  message(FATAL_ERROR "[configure] the consumer found LibTorch at ${found_torch}, not the one "
                      "fedwan was built with (${Torch_DIR})")
endif()
file(STRINGS ${consumer_build}/CMakeCache.txt found REGEX "^fedwan_DIR:")
string(FIND "${found}" "${prefix}/" at)
if(NOT at GREATER -1)
  message(FATAL_ERROR "[configure] found a fedwan outside the scratch prefix: ${found}")
endif()
run_step(build OFF ${CMAKE_COMMAND} --build ${consumer_build} --config ${BUILD_TYPE})

# 6. Run it. It must find fedwan's libraries in the prefix by itself (RPATH).
set(example ${consumer_build}/train_two_sites)
if(NOT EXISTS ${example})
  set(example ${consumer_build}/${BUILD_TYPE}/train_two_sites)
endif()
run_step(run ON ${example})
message(STATUS "consumer of the installed fedwan: built and passed")
