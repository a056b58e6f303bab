# cmake/check_command.cmake — run a program and check its exit code and output; used by ctest
# for the example tools, whose printed numbers are part of what the project promises.
#
#   cmake -DCOMMAND=<program> -DARGS="a|b|c" [-DEXIT_CODE=0] [-DSTDOUT_EMPTY=ON]
#         [-DSTDOUT_MATCHES="regex|regex"] [-DSTDERR_MATCHES="regex|regex"]
#         [-DJSON_EQUALS="key.path=value|…"] [-DJSON_RANGES="key.path=low:high|…"]
#         -P check_command.cmake
#
# "|" separates list items (";" does not survive add_test), so regexes cannot use alternation.
# STDOUT_EMPTY requires that nothing at all reached stdout: a tool that fails must not leave half
# an output behind.
# JSON checks parse stdout with string(JSON): the output must be valid JSON, EQUALS compares the
# value's text exactly (use it for integers and strings), RANGES compares numbers within
# [low, high] (use it for doubles, whose text CMake reformats).
cmake_minimum_required(VERSION 3.21)

if(NOT DEFINED COMMAND)
  message(FATAL_ERROR "check_command.cmake: COMMAND is not set")
endif()
if(NOT DEFINED EXIT_CODE)
  set(EXIT_CODE 0)
endif()

string(REPLACE "|" ";" args "${ARGS}")
execute_process(COMMAND "${COMMAND}" ${args} RESULT_VARIABLE code OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
set(failures "")

# The exit status must be exactly EXIT_CODE: "non-zero" would also pass a crash.
if(NOT "${code}" STREQUAL "${EXIT_CODE}")
  string(APPEND failures "exit code ${code}, expected ${EXIT_CODE}\n")
endif()

if(STDOUT_EMPTY AND NOT "${out}" STREQUAL "")
  string(APPEND failures "stdout is not empty\n")
endif()

foreach(stream stdout stderr)
  string(TOUPPER "${stream}_MATCHES" patterns_var)
  if(stream STREQUAL "stdout")
    set(text "${out}")
  else()
    set(text "${err}")
  endif()
  string(REPLACE "|" ";" patterns "${${patterns_var}}")
  foreach(pattern IN LISTS patterns)
    if(NOT text MATCHES "${pattern}")
      string(APPEND failures "${stream} does not match: ${pattern}\n")
    endif()
  endforeach()
endforeach()

# json_get(<out-var> <dotted.path>) — the value at the path, or a recorded failure.
macro(json_get result path)
  string(REPLACE "." ";" keys "${path}")
  string(JSON ${result} ERROR_VARIABLE json_error GET "${out}" ${keys})
  if(json_error)
    string(APPEND failures "json ${path}: ${json_error}\n")
  endif()
endmacro()

string(REPLACE "|" ";" equals "${JSON_EQUALS}")
foreach(check IN LISTS equals)
  string(REGEX REPLACE "=.*" "" path "${check}")
  string(REGEX REPLACE "^[^=]*=" "" expected "${check}")
  json_get(value "${path}")
  if(NOT json_error AND NOT "${value}" STREQUAL "${expected}")
    string(APPEND failures "json ${path} = ${value}, expected ${expected}\n")
  endif()
endforeach()

string(REPLACE "|" ";" ranges "${JSON_RANGES}")
foreach(check IN LISTS ranges)
  string(REGEX REPLACE "=.*" "" path "${check}")
  string(REGEX REPLACE "^[^=]*=" "" bounds "${check}")
  string(REPLACE ":" ";" bounds "${bounds}")
  list(GET bounds 0 low)
  list(GET bounds 1 high)
  json_get(value "${path}")
  if(NOT json_error AND (value LESS low OR value GREATER high))
    string(APPEND failures "json ${path} = ${value}, expected within [${low}, ${high}]\n")
  endif()
endforeach()

if(failures)
  list(JOIN args " " shown)
  message(FATAL_ERROR "${COMMAND} ${shown}\n${failures}--- stdout ---\n${out}--- stderr ---\n${err}")
endif()
