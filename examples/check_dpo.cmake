# Proves that dpo_fortunes's DPO moves the policy the way its pairs say. Run with cmake -P and:
#   COMMAND  the dpo_fortunes binary     ARGS  its flags, separated by "|"
#   CURVES   where --curves writes the evaluations (a CSV)
# It fails unless the run succeeds and the CSV's held-out reward margin and preference accuracy
# at the last evaluation exceed those at step 0 (where the policy is the reference, margin 0 and
# accuracy 0), and its KL to the reference is > 0 there. A DPO gradient of the wrong sign, or a
# reference that moves with the policy, fails it. Without the fortunes it prints "SKIPPED" (the
# test's SKIP_REGULAR_EXPRESSION).
string(REPLACE "|" ";" args "${ARGS}")
file(REMOVE ${CURVES})
execute_process(COMMAND ${COMMAND} ${args} --curves ${CURVES}
                OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr RESULT_VARIABLE status)
if(status EQUAL 2 AND stderr MATCHES "apt-get install fortunes")
  message("SKIPPED: the fortunes are not installed")
  return()
endif()
if(NOT status EQUAL 0)
  message(FATAL_ERROR "dpo_fortunes exited with ${status}:\n${stdout}\n${stderr}")
endif()
message("${stdout}")

file(STRINGS ${CURVES} lines)
list(LENGTH lines count)
if(count LESS 3)
  message(FATAL_ERROR "${CURVES} has ${count} lines: a header and at least two evaluations expected")
endif()
list(GET lines 0 header)
string(REPLACE "," ";" header "${header}")
foreach(column heldout_margin heldout_accuracy kl_per_byte)
  list(FIND header ${column} index_${column})
  if(index_${column} LESS 0)
    message(FATAL_ERROR "${CURVES} has no column ${column}")
  endif()
endforeach()
# CMake's list functions drop empty elements of "a,,b" only with a non-empty placeholder.
function(row_values line out)
  string(REPLACE ",," ",-,"  line "${line}")
  string(REPLACE ",," ",-,"  line "${line}")
  string(REPLACE "," ";" line "${line}")
  set(${out} "${line}" PARENT_SCOPE)
endfunction()
list(GET lines 1 first)
math(EXPR last_index "${count} - 1")
list(GET lines ${last_index} last)
row_values("${first}" first)
row_values("${last}" last)
foreach(column heldout_margin heldout_accuracy kl_per_byte)
  list(GET first ${index_${column}} start_${column})
  list(GET last ${index_${column}} end_${column})
  if(NOT end_${column} GREATER start_${column})
    message(FATAL_ERROR "${column}: ${start_${column}} at step 0, ${end_${column}} at the end: "
                        "it should have risen")
  endif()
endforeach()
message("dpo check passed: held-out margin ${start_heldout_margin} -> ${end_heldout_margin}, "
        "accuracy ${start_heldout_accuracy} -> ${end_heldout_accuracy}, "
        "KL ${end_kl_per_byte} nats a byte")
