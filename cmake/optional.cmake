# Optional pieces of suanli, included by the top-level CMakeLists when present.
# MPI transport: built when an MPI (OpenMPI or MPICH) is installed; defines SL_HAVE_MPI=1.
find_package(MPI COMPONENTS C QUIET)
if(MPI_C_FOUND)
  file(GLOB SL_MPI_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/comm/transport/mpi*.c)
  target_sources(suanli PRIVATE ${SL_MPI_SOURCES})
  target_link_libraries(suanli PUBLIC MPI::MPI_C)
  target_compile_definitions(suanli PUBLIC SL_HAVE_MPI=1)
  get_filename_component(SL_MPIEXEC_DIR "${MPIEXEC_EXECUTABLE}" DIRECTORY)
  message(STATUS "suanli: MPI transport enabled (${MPI_C_LIB_NAMES}; mpiexec: ${MPIEXEC_EXECUTABLE})")
else()
  message(STATUS "suanli: no MPI found; MPI transport not built")
endif()
