# Installation: `cmake --install build [--prefix DIR]` puts
#   bin/suanli                                      the CLI
#   lib/libsuanli.a, lib/libsuanli.so[.M.m]         the library (static and shared, same objects)
#   include/suanli/*.h                              public headers, incl. the generated version.h and the
#                                                   umbrella suanli.h
#   lib/pkgconfig/suanli.pc                         pkg-config (relocatable: paths relative to the .pc file)
#   lib/cmake/suanli/suanli{Config,ConfigVersion,Targets*}.cmake   find_package(suanli CONFIG)
# (lib is CMAKE_INSTALL_LIBDIR.) Included last by the top-level CMakeLists.txt, after cmake/*.cmake added
# their dependencies to SL_PC_REQUIRES / SL_PC_LIBS / SL_PACKAGE_PKGCONFIG / SL_PACKAGE_MPI.
include(CMakePackageConfigHelpers)
set(SL_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/suanli)

set(SL_INSTALL_TARGETS suanli suanli_cli)
if(TARGET suanli_shared)
  list(APPEND SL_INSTALL_TARGETS suanli_shared)
endif()
install(TARGETS ${SL_INSTALL_TARGETS} EXPORT suanliTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/suanli DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(FILES ${CMAKE_BINARY_DIR}/include/suanli/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/suanli)
install(EXPORT suanliTargets NAMESPACE suanli:: DESTINATION ${SL_INSTALL_CMAKEDIR})

# the pkg-config list as a CMake list literal for the config file: "CJSON libcjson" "PCRE2 libpcre2-8" ...
set(SL_PACKAGE_PKGCONFIG_CMAKE "")
foreach(p ${SL_PACKAGE_PKGCONFIG})
  string(APPEND SL_PACKAGE_PKGCONFIG_CMAKE " \"${p}\"")
endforeach()
if(SL_PACKAGE_MPI)
  set(SL_PACKAGE_MPI_BOOL TRUE)
else()
  set(SL_PACKAGE_MPI_BOOL FALSE)
endif()
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/suanliConfig.cmake.in
  ${CMAKE_BINARY_DIR}/suanliConfig.cmake INSTALL_DESTINATION ${SL_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/suanliConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/suanliConfig.cmake ${CMAKE_BINARY_DIR}/suanliConfigVersion.cmake
  DESTINATION ${SL_INSTALL_CMAKEDIR})

# suanli.pc: prefix is found from the .pc file's own location, so `--prefix` at install time just works
file(RELATIVE_PATH SL_PC_PREFIX_REL /sl_root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /sl_root)
string(REGEX REPLACE "/$" "" SL_PC_PREFIX_REL "${SL_PC_PREFIX_REL}")
configure_file(${CMAKE_SOURCE_DIR}/cmake/suanli.pc.in ${CMAKE_BINARY_DIR}/suanli.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/suanli.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
