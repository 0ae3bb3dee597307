# `cmake --install` of the library (component microscale_development): the static library, the
# public headers and a CMake package, so that other projects can
#   find_package(microscale)  and  target_link_libraries(app PRIVATE microscale::microscale).
# Included from the root CMakeLists.txt when MICROSCALE_INSTALL is on.
include(CMakePackageConfigHelpers)

set(MICROSCALE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/microscale"
    CACHE STRING "Where the CMake package files are installed, relative to the prefix")

install(TARGETS microscale EXPORT microscale-targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT microscale_development)
# cuda.hpp declares the ops of microscale_cuda, which is not installed.
install(DIRECTORY include/microscale DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT microscale_development PATTERN cuda.hpp EXCLUDE)
install(EXPORT microscale-targets NAMESPACE microscale:: DESTINATION ${MICROSCALE_INSTALL_CMAKEDIR}
        COMPONENT microscale_development)

configure_package_config_file(cmake/microscale-config.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/microscale-config.cmake
                              INSTALL_DESTINATION ${MICROSCALE_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/microscale-config-version.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/microscale-config.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/microscale-config-version.cmake
        DESTINATION ${MICROSCALE_INSTALL_CMAKEDIR} COMPONENT microscale_development)
