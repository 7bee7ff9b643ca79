# ctest `install.consumer` (cmake -P): install the build to a temporary prefix, check the layout,
# then configure + build + run cpp-tests/consumer through find_package(CONFIG), pkg-config and
# add_subdirectory.
# Inputs: BUILD_DIR WORK_DIR CONSUMER_DIR EXPECTED_VERSION SONAME REAL_NAME LIBDIR SOURCE_DIR
# CARGO_TARGET_DIR.
cmake_minimum_required(VERSION 3.22)

function(run_checked what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 240)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run_checked("install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")

# Layout: SONAME chain, headers, CMake package, pkg-config file.
set(lib "${prefix}/${LIBDIR}")
foreach(link_and_target "libmooncake_rs.so=${SONAME}" "${SONAME}=${REAL_NAME}")
  string(REPLACE "=" ";" pair "${link_and_target}")
  list(GET pair 0 link)
  list(GET pair 1 target)
  if(NOT IS_SYMLINK "${lib}/${link}")
    message(FATAL_ERROR "${lib}/${link} is not a symbolic link")
  endif()
  file(READ_SYMLINK "${lib}/${link}" actual)
  if(NOT actual STREQUAL target)
    message(FATAL_ERROR "${link} -> ${actual}, expected -> ${target}")
  endif()
endforeach()
foreach(file "${lib}/${REAL_NAME}" "${prefix}/include/mooncake_rs.h" "${prefix}/include/store_c.h"
             "${prefix}/include/mooncake_rs.hpp" "${lib}/cmake/mooncake_rs/mooncake_rsConfig.cmake"
             "${lib}/cmake/mooncake_rs/mooncake_rsConfigVersion.cmake"
             "${lib}/pkgconfig/mooncake_rs.pc")
  if(NOT EXISTS "${file}" OR IS_SYMLINK "${file}")
    message(FATAL_ERROR "missing installed file ${file}")
  endif()
endforeach()

# The real file carries the SONAME the chain is built for.
find_program(OBJDUMP objdump)
if(OBJDUMP)
  run_checked("objdump" "${OBJDUMP}" -p "${lib}/${REAL_NAME}")
  if(NOT last_output MATCHES "SONAME +${SONAME}\n")
    message(FATAL_ERROR "${REAL_NAME} has no SONAME ${SONAME} (build.rs must pass -Wl,-soname)")
  endif()
endif()

# Configure, build and run the consumer in one mode; extra arguments go to its configure step.
function(consumer mode)
  set(dir "${WORK_DIR}/consumer-${mode}")
  run_checked("configure consumer (${mode})" "${CMAKE_COMMAND}" -S "${CONSUMER_DIR}" -B "${dir}"
              "-DMODE=${mode}" "-DEXPECTED_VERSION=${EXPECTED_VERSION}" ${ARGN})
  run_checked("build consumer (${mode})" "${CMAKE_COMMAND}" --build "${dir}")
  foreach(program consumer_c consumer_cxx)
    run_checked("run ${program} (${mode})" "${dir}/${program}")
  endforeach()
endfunction()

consumer(package "-DCMAKE_PREFIX_PATH=${prefix}")

set(ENV{PKG_CONFIG_PATH} "${lib}/pkgconfig")
run_checked("pkg-config --modversion" pkg-config --modversion mooncake_rs)
string(STRIP "${last_output}" pc_version)
if(NOT pc_version STREQUAL EXPECTED_VERSION)
  message(FATAL_ERROR "pkg-config version ${pc_version}, expected ${EXPECTED_VERSION}")
endif()
consumer(pkg-config)

# add_subdirectory of the source tree; same CARGO_TARGET_DIR, so cargo has nothing to rebuild.
consumer(subdirectory "-DMOONCAKE_RS_SOURCE_DIR=${SOURCE_DIR}"
         "-DMOONCAKE_RS_CARGO_TARGET_DIR=${CARGO_TARGET_DIR}")
message(STATUS "install + consumer: ok (${prefix})")
