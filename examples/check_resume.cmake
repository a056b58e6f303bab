# Proves that a train_gpt run stopped and resumed ends exactly where the uninterrupted run ends.
# Run with cmake -P and:
#   COMMAND  the train_gpt binary        ARGS   its common flags, separated by "|"
#   STEPS    the run's --steps           STOP   the --stop-after of the first part
#   WORK     a directory for the files   NAME   a prefix for them
#   CSV      ON to compare the --curves files too (not for a mixture: its expert load is counted
#            from the resume on)
# It runs the whole run (--checkpoint, --curves), then the first part (--stop-after STOP,
# --save-state, --save-every 2) and the second (--resume, writing the finished run's state too),
# and fails unless the two final checkpoints are equal byte for byte, the report lines (step,
# loss, val, lr) of the two parts are those of the whole run, and (CSV) the curves files are
# equal. Without the fortunes it prints "SKIPPED" (the test's
# SKIP_REGULAR_EXPRESSION).
string(REPLACE "|" ";" args "${ARGS}")
set(full ${WORK}/${NAME}_full.safetensors)
set(resumed ${WORK}/${NAME}_resumed.safetensors)
set(state ${WORK}/${NAME}_state.safetensors)
file(REMOVE ${full} ${resumed} ${state} ${WORK}/${NAME}_finished.safetensors
     ${WORK}/${NAME}_full.csv ${WORK}/${NAME}_resumed.csv)

function(run_part out)
  execute_process(COMMAND ${COMMAND} ${args} --steps ${STEPS} --svg none ${ARGN}
                  OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr RESULT_VARIABLE status)
  if(status EQUAL 2 AND stderr MATCHES "apt-get install fortunes")
    message("SKIPPED: the fortunes are not installed")
    set(${out} SKIPPED PARENT_SCOPE)
    return()
  endif()
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "train_gpt ${ARGN} exited with ${status}:\n${stdout}\n${stderr}")
  endif()
  message("${stdout}")
  set(${out} "${stdout}" PARENT_SCOPE)
endfunction()

# The report lines up to the learning rate (the speed and ETA that follow differ from run to run).
function(report_lines text out)
  string(REGEX MATCHALL "step +[0-9]+/[0-9]+  loss [0-9.]+(  val [0-9.]+)?  lr [0-9.e+-]+" lines
         "${text}")
  string(REGEX MATCHALL "expert load, mean of [^\n]*" loads "${text}")
  set(${out} "${lines};${loads}" PARENT_SCOPE)
endfunction()

set(csv_full)
set(csv_resumed)
if(CSV)
  set(csv_full --curves ${WORK}/${NAME}_full.csv)
  set(csv_resumed --curves ${WORK}/${NAME}_resumed.csv)
endif()
run_part(whole --checkpoint ${full} ${csv_full})
if(whole STREQUAL "SKIPPED")
  return()
endif()
run_part(first --stop-after ${STOP} --save-state ${state} --save-every 2)
if(NOT first MATCHES "stopped after step ${STOP}/${STEPS}: wrote the training state")
  message(FATAL_ERROR "the first part did not stop at step ${STOP}")
endif()
if(NOT EXISTS ${state} OR NOT first MATCHES "wrote the training state at step 2 to")
  message(FATAL_ERROR "no training state at ${state}, or none written by --save-every 2")
endif()
run_part(second --resume ${state} --checkpoint ${resumed} ${csv_resumed}
         --save-state ${WORK}/${NAME}_finished.safetensors)
if(NOT second MATCHES "resumed from [^\n]* at step ${STOP}/${STEPS}")
  message(FATAL_ERROR "the second part did not resume at step ${STOP}")
endif()

report_lines("${whole}" expected)
report_lines("${first}${second}" got)
if(NOT expected STREQUAL got)
  message(FATAL_ERROR "the report lines differ:\nwhole run: ${expected}\nin two parts: ${got}")
endif()
list(LENGTH expected count)
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${full} ${resumed} RESULT_VARIABLE differ)
if(differ)
  message(FATAL_ERROR "${full} and ${resumed} differ: the resumed run did not end where the "
                      "whole run ends")
endif()
if(CSV)
  execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK}/${NAME}_full.csv
                          ${WORK}/${NAME}_resumed.csv RESULT_VARIABLE differ)
  if(differ)
    message(FATAL_ERROR "the --curves files of the whole run and of the resumed one differ")
  endif()
endif()
message("resume check passed: ${count} report lines equal, final checkpoints equal byte for byte")
