# Finds LibTorch for fedwan without letting it steer fedwan's own build.
#
# Both LibTorch lines are supported: Debian's libtorch-dev (1.13, C++17) and
# the LibTorch inside PyPI's `torch` wheel (2.x, C++20, CUDA), pointed at with
#   -DCMAKE_PREFIX_PATH=$(python -c 'import torch; print(torch.utils.cmake_prefix_path)')
#
# What TorchConfig does that fedwan undoes or settles here:
# - With a CUDA toolkit present it appends nvcc -gencode flags for its own
#   architecture list (from compute_50 on, which nvcc 13 rejects) to
#   CMAKE_CUDA_FLAGS and turns CMAKE_CUDA_ARCHITECTURES off. fedwan's CUDA
#   code is built for its own architectures (cuda/CMakeLists.txt), so both
#   are restored after find_package(Torch).
# - It may pick a `libtorch.so` from the system's library path for
#   TORCH_LIBRARY when another LibTorch is installed there; fedwan links the
#   imported `torch` target only, whose locations come from the package found.
#
# Sets FEDWAN_TORCH_VERSION, FEDWAN_TORCH_LIB_DIR (where libtorch_cpu.so
# is), FEDWAN_TORCH_HAS_OWN_GLOO (that LibTorch carries its own copy of Gloo,
# instead of linking the system's libgloo) and FEDWAN_TORCH_NCCL_DIR (the
# NCCL that LibTorch's CUDA library loads, when it ships beside it).
#
# Some LibTorch wheels (2.11's) export their own static copy of parts of
# libstdc++ (`std::filesystem::remove_all` and others) whose code calls
# symbols that an older libstdc++ (Debian 12's GCC 12) lacks: a program that
# names libtorch before libstdc++ binds every `std::filesystem` call to that
# copy and crashes on a null call. Against such a LibTorch, every program
# and library that links the `torch` target names libstdc++ first, so the
# system's libstdc++ answers those symbols for the whole process
# (FEDWAN_TORCH_EXPORTS_LIBSTDCXX).
# Whether the shared library `so` defines a dynamic symbol whose `nm -D`
# line contains `needle` (TRUE or FALSE in out_var; FALSE without nm or the
# file).
function(fedwan_library_defines so needle out_var)
  set(_found FALSE)
  if(CMAKE_NM AND EXISTS "${so}")
    execute_process(COMMAND ${CMAKE_NM} -D --defined-only "${so}"
                    OUTPUT_VARIABLE _syms ERROR_QUIET)
    string(FIND "${_syms}" "${needle}" _at)
    if(NOT _at EQUAL -1)
      set(_found TRUE)
    endif()
  endif()
  set(${out_var} ${_found} PARENT_SCOPE)
endfunction()

macro(fedwan_find_torch)
  set(_fedwan_cuda_flags "${CMAKE_CUDA_FLAGS}")
  if(DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(_fedwan_cuda_archs "${CMAKE_CUDA_ARCHITECTURES}")
  else()
    unset(_fedwan_cuda_archs)
  endif()
  # Keeps TorchConfig from probing for a GPU or listing old architectures;
  # its flags are dropped below anyway.
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
    set(_fedwan_set_arch_list TRUE)
  endif()
  find_package(Torch REQUIRED)
  set(CMAKE_CUDA_FLAGS "${_fedwan_cuda_flags}")
  if(DEFINED _fedwan_cuda_archs)
    set(CMAKE_CUDA_ARCHITECTURES "${_fedwan_cuda_archs}")
  else()
    unset(CMAKE_CUDA_ARCHITECTURES)
  endif()
  if(_fedwan_set_arch_list)
    unset(TORCH_CUDA_ARCH_LIST)
  endif()

  get_target_property(_fedwan_torch_cpu torch_cpu IMPORTED_LOCATION_RELEASE)
  if(NOT _fedwan_torch_cpu)
    get_target_property(_fedwan_torch_cpu torch_cpu IMPORTED_LOCATION)
  endif()
  if(NOT _fedwan_torch_cpu)
    # Debian's config names the library through TORCH_LIBRARIES only.
    find_library(_fedwan_torch_cpu torch_cpu HINTS ${TORCH_INSTALL_PREFIX}/lib)
  endif()
  get_filename_component(FEDWAN_TORCH_LIB_DIR "${_fedwan_torch_cpu}" DIRECTORY)
  set(FEDWAN_TORCH_VERSION "${Torch_VERSION}")

  # A LibTorch that defines Gloo's symbols itself (the wheel does) would
  # take fedwan's calls into a Gloo other than the one fedwan was compiled
  # against: fedwan then uses that LibTorch's Gloo through c10d instead.
  fedwan_library_defines("${_fedwan_torch_cpu}" "_ZN4gloo" FEDWAN_TORCH_HAS_OWN_GLOO)

  set(FEDWAN_TORCH_EXPORTS_LIBSTDCXX FALSE)
  foreach(_fedwan_lib libtorch.so libtorch_cpu.so)
    fedwan_library_defines("${FEDWAN_TORCH_LIB_DIR}/${_fedwan_lib}" " T _ZNSt10filesystem" _fedwan_has)
    if(_fedwan_has)
      set(FEDWAN_TORCH_EXPORTS_LIBSTDCXX TRUE)
    endif()
  endforeach()
  if(FEDWAN_TORCH_EXPORTS_LIBSTDCXX)
    set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS
                 "LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")
    message(STATUS "fedwan: that LibTorch exports libstdc++ symbols: programs name libstdc++ first")
  endif()

  # The wheel's CUDA library loads the NCCL of the `nvidia-nccl` wheel
  # (site-packages/nvidia/nccl), newer than a toolkit's: fedwan links the
  # same one, so one NCCL is in the process.
  unset(FEDWAN_TORCH_NCCL_DIR)
  get_filename_component(_fedwan_site "${FEDWAN_TORCH_LIB_DIR}/../.." ABSOLUTE)
  if(EXISTS "${_fedwan_site}/nvidia/nccl/include/nccl.h")
    set(FEDWAN_TORCH_NCCL_DIR "${_fedwan_site}/nvidia/nccl")
  endif()
  if(FEDWAN_TORCH_HAS_OWN_GLOO)
    set(_fedwan_gloo "its own Gloo (used through c10d)")
  else()
    set(_fedwan_gloo "the system's Gloo")
  endif()
  message(STATUS "fedwan: LibTorch ${FEDWAN_TORCH_VERSION} in ${FEDWAN_TORCH_LIB_DIR}, with ${_fedwan_gloo}")
endmacro()
