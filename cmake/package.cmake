# The installed package: a CMake config (find_package(ringreduce CONFIG) gives the imported target
# ringreduce::ringreduce) and a pkg-config file. Both locate the prefix relative to themselves, so
# an installed tree can be moved.
include(CMakePackageConfigHelpers)
set(RR_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ringreduce)
install(EXPORT ringreduceTargets NAMESPACE ringreduce:: DESTINATION ${RR_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/ringreduceConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ringreduceConfig.cmake
                              INSTALL_DESTINATION ${RR_CMAKE_DIR})
# 0.x: a new minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ringreduceConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ringreduceConfig.cmake
              ${PROJECT_BINARY_DIR}/ringreduceConfigVersion.cmake DESTINATION ${RR_CMAKE_DIR})

set(RR_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH RR_PC_PREFIX_FROM_PCDIR /prefix/${RR_PC_DIR} /prefix)
string(REGEX REPLACE "/$" "" RR_PC_PREFIX_FROM_PCDIR "${RR_PC_PREFIX_FROM_PCDIR}")
configure_file(${CMAKE_CURRENT_LIST_DIR}/ringreduce.pc.in ${PROJECT_BINARY_DIR}/ringreduce.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ringreduce.pc DESTINATION ${RR_PC_DIR})
