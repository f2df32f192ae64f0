# CUDA backend (src/device/cuda): built when nvcc, the CUDA runtime and cuBLAS/cuBLASLt are found.
# SL_CUDA=AUTO (default) builds it when found, ON requires it, OFF leaves it out. The toolkit is looked for
# in SL_CUDA_HOME, $CUDA_HOME, /opt/suanli-cuda/cuda (scripts/cuda_toolkit.sh installs NVIDIA's PyPI wheels
# there) and /usr/local/cuda. Defines SL_HAVE_CUDA=1 when built; otherwise cuda_stub.c is compiled and
# sl_backend_cuda() returns NULL saying why.
#
# Note [CUDA build: nvcc as a custom step]
# The .cu kernels (src/device/cuda/kernels/*.cu) are compiled by nvcc in add_custom_command steps, not with
# enable_language(CUDA): the project's C flags (add_compile_options -Wall -Wextra -Werror, sanitizers,
# -fno-semantic-interposition) stay C-only, nvcc gets its own (-Xcompiler -fPIC,-Wall,-Wextra and
# -Werror all-warnings under SL_WERROR), and no CMake CUDA compiler identification has to understand the
# wheel layout. The objects are added to libsuanli.a and libsuanli.so; the host side of the backend is C
# (cuda_*.c, gcc) calling extern "C" launchers. nvcc's host code needs libstdc++ (guard variables, the
# personality routine), so the library links it. Architectures: SL_CUDA_ARCHS (default 80;90: A100 and
# H100/H200 SASS) plus PTX for the last one, which newer GPUs JIT-compile.
set(SL_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO (when nvcc + cuBLAS are found), ON, OFF")
set_property(CACHE SL_CUDA PROPERTY STRINGS AUTO ON OFF)
set(SL_CUDA_HOME "" CACHE PATH "CUDA toolkit root (bin/nvcc, include/, lib64/)")
set(SL_CUDA_ARCHS "80;90" CACHE STRING "CUDA SM architectures to compile SASS for (PTX for the last)")
set(SL_CUDA_ENABLED OFF)
set(SL_CUDA_DIR ${CMAKE_SOURCE_DIR}/src/device/cuda)
if(NOT SL_CUDA STREQUAL "OFF")
  set(_hints ${SL_CUDA_HOME} $ENV{CUDA_HOME} $ENV{CUDA_PATH} /opt/suanli-cuda/cuda /usr/local/cuda)
  find_program(SL_NVCC nvcc HINTS ${_hints} PATH_SUFFIXES bin NO_DEFAULT_PATH)
  if(SL_NVCC)
    get_filename_component(_root ${SL_NVCC} DIRECTORY)
    get_filename_component(_root ${_root} DIRECTORY)
    set(_hints ${_root} ${_hints})
  endif()
  find_path(SL_CUDA_INCLUDE cuda_runtime_api.h HINTS ${_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_path(SL_CUBLAS_INCLUDE cublasLt.h HINTS ${_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_library(SL_CUDART_LIB cudart HINTS ${_hints} PATH_SUFFIXES lib64 lib NO_DEFAULT_PATH)
  find_library(SL_CUBLAS_LIB cublas HINTS ${_hints} PATH_SUFFIXES lib64 lib NO_DEFAULT_PATH)
  find_library(SL_CUBLASLT_LIB cublasLt HINTS ${_hints} PATH_SUFFIXES lib64 lib NO_DEFAULT_PATH)
  if(SL_NVCC AND SL_CUDA_INCLUDE AND SL_CUBLAS_INCLUDE AND SL_CUDART_LIB AND SL_CUBLAS_LIB AND SL_CUBLASLT_LIB)
    set(SL_CUDA_ENABLED ON)
  elseif(SL_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SL_CUDA=ON but no complete CUDA toolkit was found (nvcc=${SL_NVCC} "
      "include=${SL_CUDA_INCLUDE} cudart=${SL_CUDART_LIB} cublas=${SL_CUBLAS_LIB} cublasLt=${SL_CUBLASLT_LIB}); "
      "run scripts/cuda_toolkit.sh and pass -DSL_CUDA_HOME=<its CUDA_HOME>")
  endif()
endif()

if(SL_CUDA_ENABLED)
  execute_process(COMMAND ${SL_NVCC} --version OUTPUT_VARIABLE _v ERROR_QUIET)
  string(REGEX MATCH "release ([0-9]+\\.[0-9]+)" _m "${_v}")
  set(SL_CUDA_VERSION ${CMAKE_MATCH_1})
  set(_gencode "")
  foreach(a ${SL_CUDA_ARCHS})
    list(APPEND _gencode -gencode arch=compute_${a},code=sm_${a})
    set(_last ${a})
  endforeach()
  list(APPEND _gencode -gencode arch=compute_${_last},code=compute_${_last})
  set(_xc "-fPIC")
  set(_werr "")
  if(SL_WERROR)
    set(_xc "${_xc},-Wall,-Wextra,-Werror")
    set(_werr -Werror all-warnings)
  endif()
  if(CMAKE_BUILD_TYPE MATCHES "Deb")
    set(_opt -O0 -g -lineinfo)
  else()
    set(_opt -O3 -lineinfo)
  endif()
  # --fmad=false: no multiply-add contraction, as in the CPU reference kernels (src/device/cuda/README.md, "Numerics").
  find_program(SL_CUDA_HOST_CXX NAMES g++ c++)
  file(GLOB SL_CUDA_KERNELS CONFIGURE_DEPENDS ${SL_CUDA_DIR}/kernels/*.cu)
  set(SL_CUDA_OBJS "")
  foreach(cu ${SL_CUDA_KERNELS})
    get_filename_component(n ${cu} NAME_WE)
    set(o ${CMAKE_BINARY_DIR}/src/device/cuda/${n}.cu.o)
    add_custom_command(OUTPUT ${o}
      COMMAND ${SL_NVCC} -ccbin ${SL_CUDA_HOST_CXX} -std=c++17 ${_opt} --fmad=false ${_gencode} ${_werr}
              -Xcompiler=${_xc} -I${CMAKE_SOURCE_DIR}/include -I${CMAKE_SOURCE_DIR}/src -I${SL_CUDA_INCLUDE}
              -MD -MF ${o}.d -c ${cu} -o ${o}
      DEPENDS ${cu} DEPFILE ${o}.d
      COMMENT "nvcc ${n}.cu" VERBATIM)
    list(APPEND SL_CUDA_OBJS ${o})
  endforeach()
  add_custom_target(suanli_cuda_kernels DEPENDS ${SL_CUDA_OBJS})
  file(GLOB SL_CUDA_SOURCES CONFIGURE_DEPENDS ${SL_CUDA_DIR}/*.c)
  list(FILTER SL_CUDA_SOURCES EXCLUDE REGEX "cuda_stub\\.c$")
  target_sources(suanli_objects PRIVATE ${SL_CUDA_SOURCES})
  target_include_directories(suanli_objects SYSTEM PRIVATE ${SL_CUDA_INCLUDE} ${SL_CUBLAS_INCLUDE})
  target_sources(suanli PRIVATE ${SL_CUDA_OBJS})
  add_dependencies(suanli suanli_cuda_kernels)
  if(TARGET suanli_shared)
    target_sources(suanli_shared PRIVATE ${SL_CUDA_OBJS})
    add_dependencies(suanli_shared suanli_cuda_kernels)
  endif()
  # cuBLAS is not linked: cuda_blas.c opens it on first use (Note [cuBLAS loaded on first use]); the toolkit's
  # library directory is compiled in as the first place to look.
  get_filename_component(SL_CUDA_LIBDIR ${SL_CUDART_LIB} DIRECTORY)
  get_filename_component(_blasdir ${SL_CUBLAS_LIB} DIRECTORY)
  set_source_files_properties(${SL_CUDA_DIR}/cuda_blas.c PROPERTIES COMPILE_DEFINITIONS SL_CUDA_LIBDIR="${_blasdir}")
  set(SL_CUDA_LIBS ${SL_CUDART_LIB} stdc++ ${CMAKE_DL_LIBS})
  # NCCL transport sketch (src/comm/transport/nccl.c, Note [NCCL transport sketch]): compile-only
  find_path(SL_NCCL_INCLUDE nccl.h HINTS ${_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_library(SL_NCCL_LIB nccl HINTS ${_hints} PATH_SUFFIXES lib64 lib NO_DEFAULT_PATH)
  if(SL_NCCL_INCLUDE AND SL_NCCL_LIB)
    set_source_files_properties(${CMAKE_SOURCE_DIR}/src/comm/transport/nccl.c PROPERTIES
      COMPILE_DEFINITIONS SL_HAVE_NCCL=1 INCLUDE_DIRECTORIES "${SL_NCCL_INCLUDE};${SL_CUDA_INCLUDE}")
    if(TARGET suanli_shared)  # only libsuanli.so needs it: no executable pulls nccl.o from libsuanli.a
      target_link_libraries(suanli_shared PRIVATE ${SL_NCCL_LIB})
    endif()
    message(STATUS "suanli: NCCL transport sketch compiled (${SL_NCCL_LIB}; not wired into comm init)")
  endif()
  sl_library_link(${SL_CUDA_LIBS})
  sl_library_define(SL_HAVE_CUDA=1)
  foreach(l ${SL_CUDA_LIBS})
    if(l MATCHES "^[/-]")
      string(APPEND SL_PC_LIBS " ${l}")
    else()
      string(APPEND SL_PC_LIBS " -l${l}")  # a bare library name (stdc++) is a -l flag in suanli.pc
    endif()
  endforeach()
  message(STATUS "suanli: CUDA backend enabled (nvcc ${SL_CUDA_VERSION}: ${SL_NVCC}; archs ${SL_CUDA_ARCHS} + PTX; ${SL_CUDA_LIBDIR})")
else()
  target_sources(suanli_objects PRIVATE ${SL_CUDA_DIR}/cuda_stub.c)
  message(STATUS "suanli: CUDA backend not built (SL_CUDA=${SL_CUDA})")
endif()
