# Builds and runs the consumer project of this folder (cmake -P), in one of two ways:
#   MODE=add_subdirectory: the consumer adds SOURCE_DIR as a subdirectory (README.md's way);
#   MODE=find_package: `cmake --install` of the build tree BUILD_TREE into a fresh prefix under
#                      WORK_DIR, then the consumer finds that prefix with find_package(microscale).
# Also takes WORK_DIR (scratch folder), GENERATOR and CXX (forwarded from the tested build) and
# LAUNCHER (the tested build's compiler launcher, e.g. ccache, or empty).
foreach(var MODE SOURCE_DIR WORK_DIR GENERATOR CXX)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "build_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

set(consumer_build "${WORK_DIR}/build")
set(configure_args -S "${CMAKE_CURRENT_LIST_DIR}" -B "${consumer_build}" -G "${GENERATOR}"
                   "-DCMAKE_CXX_COMPILER=${CXX}")
if(LAUNCHER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER}")
endif()

if(MODE STREQUAL "add_subdirectory")
  # The build folder is kept between runs: the library's sources compile once, not every run.
  list(APPEND configure_args "-DMICROSCALE_SOURCE_DIR=${SOURCE_DIR}")
elseif(MODE STREQUAL "find_package")
  if(NOT DEFINED BUILD_TREE)
    message(FATAL_ERROR "build_consumer.cmake: MODE=find_package needs -DBUILD_TREE=...")
  endif()
  # Fresh each run, so nothing from an earlier install or configure can stand in for this one.
  set(prefix "${WORK_DIR}/prefix")
  file(REMOVE_RECURSE "${prefix}" "${consumer_build}")
  run("${CMAKE_COMMAND}" --install "${BUILD_TREE}" --prefix "${prefix}" --component microscale_development)
  list(APPEND configure_args "-DCMAKE_PREFIX_PATH=${prefix}" "-DMICROSCALE_SOURCE_DIR=")
else()
  message(FATAL_ERROR "build_consumer.cmake: MODE must be add_subdirectory or find_package, not '${MODE}'")
endif()

run("${CMAKE_COMMAND}" ${configure_args})
# Only the consumer and what it links: the library's own tests, CLI and benchmarks are off in a
# project that is not the top level, and are not asked for here anyway.
run("${CMAKE_COMMAND}" --build "${consumer_build}" --target consumer)
run("${consumer_build}/consumer")
