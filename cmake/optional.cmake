# Optional pieces of suanli, included by the top-level CMakeLists when present.
# MPI transport: built when an MPI (OpenMPI or MPICH) is installed; defines SL_HAVE_MPI=1.
find_package(MPI COMPONENTS C QUIET)
if(MPI_C_FOUND)
  file(GLOB SL_MPI_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/comm/transport/mpi*.c)
  target_sources(suanli_objects PRIVATE ${SL_MPI_SOURCES})
  sl_library_link(MPI::MPI_C)
  sl_library_define(SL_HAVE_MPI=1)
  set(SL_PACKAGE_MPI ON)
  foreach(l ${MPI_C_LIBRARIES})
    string(APPEND SL_PC_LIBS " ${l}")
  endforeach()
  get_filename_component(SL_MPIEXEC_DIR "${MPIEXEC_EXECUTABLE}" DIRECTORY)
  message(STATUS "suanli: MPI transport enabled (${MPI_C_LIB_NAMES}; mpiexec: ${MPIEXEC_EXECUTABLE})")
else()
  message(STATUS "suanli: no MPI found; MPI transport not built")
endif()

# MPICH next to the default MPI (Debian's mpich + libmpich-dev install beside OpenMPI as mpicc.mpich /
# mpiexec.mpich): base + comm + the MPI transport are built a second time against it (target
# suanli_comm_mpich) so tests/comm can run the comm matrix under mpiexec.mpich too. Off with
# -DSL_MPICH=OFF; skipped when MPICH is missing or already the default MPI.
option(SL_MPICH "Also build the comm library against MPICH when it is installed beside the default MPI" ON)
set(SL_MPICH_FOUND FALSE)
if(SL_MPICH AND NOT "${MPI_C_LIB_NAMES}" MATCHES "mpich")
  pkg_check_modules(SL_MPICH_PC QUIET mpich)
  find_program(SL_MPIEXEC_MPICH NAMES mpiexec.mpich mpiexec.hydra)
  find_path(SL_MPICH_INCLUDE mpi.h HINTS ${SL_MPICH_PC_INCLUDE_DIRS} PATHS /usr/include/x86_64-linux-gnu/mpich
            /usr/include/mpich NO_DEFAULT_PATH)
  find_library(SL_MPICH_LIB mpich HINTS ${SL_MPICH_PC_LIBRARY_DIRS})
  if(SL_MPIEXEC_MPICH AND SL_MPICH_INCLUDE AND SL_MPICH_LIB)
    set(SL_MPICH_FOUND TRUE)
    file(GLOB SL_MPICH_COMM_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/base/*.c ${CMAKE_SOURCE_DIR}/src/comm/*.c
         ${CMAKE_SOURCE_DIR}/src/comm/algo/*.c ${CMAKE_SOURCE_DIR}/src/comm/transport/*.c)
    add_library(suanli_comm_mpich STATIC ${SL_MPICH_COMM_SOURCES})
    target_include_directories(suanli_comm_mpich PUBLIC ${CMAKE_SOURCE_DIR}/include ${CMAKE_BINARY_DIR}/include
                               PRIVATE ${CMAKE_SOURCE_DIR}/src)
    target_include_directories(suanli_comm_mpich SYSTEM PRIVATE ${SL_MPICH_INCLUDE})
    target_compile_definitions(suanli_comm_mpich PUBLIC SL_HAVE_MPI=1)
    target_link_libraries(suanli_comm_mpich PUBLIC ${SL_MPICH_LIB} Threads::Threads m)
    message(STATUS "suanli: also building comm against MPICH (${SL_MPICH_LIB}; mpiexec: ${SL_MPIEXEC_MPICH})")
  endif()
endif()
include(${CMAKE_SOURCE_DIR}/cmake/opencl.cmake)
include(${CMAKE_SOURCE_DIR}/cmake/cuda.cmake)

# Erasure-coded pooled checkpoints (--ckpt-ec): Intel ISA-L (Debian: libisal-dev). Without it the build
# works and --ckpt-ec fails with a message saying so. -DSL_ISAL=OFF skips the search.
option(SL_ISAL "Use Intel ISA-L for erasure-coded checkpoints when it is installed" ON)
if(SL_ISAL)
  find_path(SL_ISAL_INCLUDE isa-l/erasure_code.h)
  find_library(SL_ISAL_LIB isal)
endif()
if(SL_ISAL AND SL_ISAL_INCLUDE AND SL_ISAL_LIB)
  target_include_directories(suanli_objects SYSTEM PRIVATE ${SL_ISAL_INCLUDE})
  sl_library_link(${SL_ISAL_LIB})
  target_compile_definitions(suanli_objects PRIVATE SL_HAVE_ISAL=1)
  string(APPEND SL_PC_LIBS " -lisal")
  message(STATUS "suanli: erasure-coded checkpoints enabled (ISA-L: ${SL_ISAL_LIB})")
else()
  message(STATUS "suanli: no ISA-L (libisal-dev); --ckpt-ec is not available")
endif()
