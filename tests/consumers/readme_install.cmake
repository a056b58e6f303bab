# tests/consumers/readme_install.cmake — README's install recipe, run exactly as written:
#
#   cmake -S dissect -B build && cmake --install build --prefix /opt/dissect
#
# on a fresh directory, with no build step between (the kernels' library is built by the consumer,
# from the installed share/dissect/kernels.cpp), then the find_package consumer configured, built
# and run against that prefix. Run by ctest
# (consumer_readme_install):
#
#   cmake -DSOURCE_DIR=<repo> -DWORK_DIR=<scratch> -DCONSUMER_DIR=<tests/consumers/find_package>
#         -DCXX_COMPILER=<c++> -DGENERATOR=<generator> -P readme_install.cmake
cmake_minimum_required(VERSION 3.21)

foreach(variable IN ITEMS SOURCE_DIR WORK_DIR CONSUMER_DIR CXX_COMPILER GENERATOR)
  if(NOT DEFINED ${variable})
    message(FATAL_ERROR "readme_install.cmake: ${variable} is not set")
  endif()
endforeach()

# run(<step> <command...>): runs the command in WORK_DIR, stops with its output if it fails.
function(run step)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE status
                  OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "readme_install: ${step} failed (${status}):\n  ${ARGN}\n${output}")
  endif()
  message(STATUS "readme_install: ${step}: ok")
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})  # a clean directory: nothing built before
file(MAKE_DIRECTORY ${WORK_DIR})
set(build ${WORK_DIR}/build)
set(prefix ${WORK_DIR}/prefix)

# The recipe, word for word (only the paths differ).
run("configure" ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${build})
run("install without a build" ${CMAKE_COMMAND} --install ${build} --prefix ${prefix})

# Nothing was built, and what a consumer needs is there.
foreach(installed IN ITEMS include/dissect/layers/linear.hpp share/cmake/dissect/dissectConfig.cmake
                           share/cmake/dissect/dissectTargets.cmake share/pkgconfig/dissect.pc
                           share/dissect/kernels.cpp)
  if(NOT EXISTS ${prefix}/${installed})
    message(FATAL_ERROR "readme_install: ${prefix}/${installed} was not installed")
  endif()
endforeach()
# pkg-config users compile the kernels' unit themselves: dissect.pc names it.
file(STRINGS ${prefix}/share/pkgconfig/dissect.pc kernels_source REGEX "^kernels_source=")
string(REPLACE "kernels_source=\${prefix}" "${prefix}" kernels_source "${kernels_source}")
if(NOT EXISTS "${kernels_source}")
  message(FATAL_ERROR "readme_install: dissect.pc's kernels_source '${kernels_source}' does not exist")
endif()
file(GLOB programs ${prefix}/bin/*)  # (the tools' OPTIONAL rules may leave bin/ empty)
if(programs)
  message(FATAL_ERROR "readme_install: programs installed though none was built: ${programs}")
endif()

# The find_package consumer against that prefix.
run("configure the find_package consumer" ${CMAKE_COMMAND} -S ${CONSUMER_DIR}
    -B ${WORK_DIR}/consumer -G ${GENERATOR} -DCMAKE_BUILD_TYPE=None
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix})
run("build the find_package consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run("run the find_package consumer" ${WORK_DIR}/consumer/consumer)
