# OpenCL backend (src/device/opencl): built when the OpenCL 1.2 headers and an ICD loader are found
# (Debian: ocl-icd-opencl-dev; a device comes from an ICD such as pocl-opencl-icd). SL_OPENCL=AUTO (default)
# builds it when found, ON requires it, OFF leaves it out. Defines SL_HAVE_OPENCL=1 when built. When it is
# not built, opencl_stub.c is compiled instead: sl_backend_opencl() then returns NULL with a message.
# The kernels (src/device/opencl/kernels/*.cl) are embedded in the library as C strings at build time
# (cmake/embed_cl.cmake) and compiled at run time with clBuildProgram.
set(SL_OPENCL AUTO CACHE STRING "Build the OpenCL backend: AUTO (when OpenCL is found), ON, OFF")
set_property(CACHE SL_OPENCL PROPERTY STRINGS AUTO ON OFF)
set(SL_OPENCL_ENABLED OFF)
if(NOT SL_OPENCL STREQUAL "OFF")
  find_package(OpenCL QUIET)
  if(OpenCL_FOUND)
    set(SL_OPENCL_ENABLED ON)
  elseif(SL_OPENCL STREQUAL "ON")
    message(FATAL_ERROR "SL_OPENCL=ON but no OpenCL headers/library were found (apt-get install ocl-icd-opencl-dev)")
  endif()
endif()
set(SL_OCL_DIR ${CMAKE_SOURCE_DIR}/src/device/opencl)
if(SL_OPENCL_ENABLED)
  file(GLOB SL_OCL_SOURCES CONFIGURE_DEPENDS ${SL_OCL_DIR}/*.c)
  list(FILTER SL_OCL_SOURCES EXCLUDE REGEX "opencl_stub\\.c$")
  file(GLOB SL_OCL_KERNELS CONFIGURE_DEPENDS ${SL_OCL_DIR}/kernels/*.cl)
  set(SL_OCL_GEN ${CMAKE_BINARY_DIR}/src/device/opencl/opencl_sources.c)
  add_custom_command(OUTPUT ${SL_OCL_GEN}
    COMMAND ${CMAKE_COMMAND} -DDIR=${SL_OCL_DIR}/kernels -DOUT=${SL_OCL_GEN} -P ${CMAKE_SOURCE_DIR}/cmake/embed_cl.cmake
    DEPENDS ${SL_OCL_KERNELS} ${CMAKE_SOURCE_DIR}/cmake/embed_cl.cmake
    COMMENT "Embedding the OpenCL kernels" VERBATIM)
  target_sources(suanli_objects PRIVATE ${SL_OCL_SOURCES} ${SL_OCL_GEN})
  target_include_directories(suanli_objects SYSTEM PRIVATE ${OpenCL_INCLUDE_DIRS})
  sl_library_link(${OpenCL_LIBRARIES})
  sl_library_define(SL_HAVE_OPENCL=1)
  foreach(l ${OpenCL_LIBRARIES})
    string(APPEND SL_PC_LIBS " ${l}")
  endforeach()
  message(STATUS "suanli: OpenCL backend enabled (${OpenCL_LIBRARIES}, OpenCL ${OpenCL_VERSION_STRING} headers)")
else()
  target_sources(suanli_objects PRIVATE ${SL_OCL_DIR}/opencl_stub.c)
  message(STATUS "suanli: OpenCL backend not built (SL_OPENCL=${SL_OPENCL})")
endif()
