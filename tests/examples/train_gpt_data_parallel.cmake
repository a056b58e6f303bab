# tests/examples/train_gpt_data_parallel.cmake — train_gpt under `mpiexec -n 2` against one
# process on the same global batches: ctest's example_train_gpt_data_parallel.
#
#   cmake -DTRAIN_GPT=<train_gpt> -DMPIEXEC="mpiexec|-n|2|flags…" -DARGS="a|b|c" -DOUT=<dir>
#         -P train_gpt_data_parallel.cmake
#
# Three runs of the same ARGS, each writing --curves (losses with 6 decimals): one process; two
# ranks; two ranks with --shard-optimizer. The two-rank runs must write the same curves, byte
# for byte (ZeRO-1 makes the same updates); the final validation loss of two ranks must be
# within 1e-3 of one process's. That bound: the ranks' gradients differ from one process's by
# the rounding of another summation order over the batch (test_data_parallel bounds it), which
# AdamW turns into value gaps of at most its step (lr = 3e-3 here) on the few entries whose
# gradient is rounding noise, and ~1e-7 elsewhere; the loss moves far less than 1e-3 under
# them. Exit status 2 from train_gpt without the fortunes skips the test.
cmake_minimum_required(VERSION 3.21)

string(REPLACE "|" ";" mpiexec "${MPIEXEC}")
string(REPLACE "|" ";" args "${ARGS}")

function(run_train_gpt name)
  execute_process(COMMAND ${ARGN} ${args} --curves ${OUT}/${name}.csv --svg none
                  RESULT_VARIABLE code OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(code EQUAL 2 AND err MATCHES "apt-get install fortunes")
    message(FATAL_ERROR "SKIP (ctest's SKIP_REGULAR_EXPRESSION): ${err}")
  endif()
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "${name}: exit code ${code}\n${out}\n${err}")
  endif()
  message("${name}:\n${out}")
  file(STRINGS ${OUT}/${name}.csv rows)
  list(GET rows -1 last)
  string(REGEX MATCH "[^,]+$" val "${last}")
  set(${name}_val ${val} PARENT_SCOPE)
  file(READ ${OUT}/${name}.csv text)
  set(${name}_csv "${text}" PARENT_SCOPE)
endfunction()

file(MAKE_DIRECTORY ${OUT})
run_train_gpt(one ${TRAIN_GPT})
run_train_gpt(two ${mpiexec} ${TRAIN_GPT})
run_train_gpt(zero ${mpiexec} ${TRAIN_GPT} --shard-optimizer)

if(NOT two_csv STREQUAL zero_csv)
  message(FATAL_ERROR "two ranks with and without --shard-optimizer wrote different curves:\n"
                      "${two_csv}\n---\n${zero_csv}")
endif()
# CMake has no floating point: compare in micro-units of the 6-decimal text.
string(REGEX REPLACE "\\." "" one_micro "${one_val}")
string(REGEX REPLACE "\\." "" two_micro "${two_val}")
string(REGEX REPLACE "^0+" "" one_micro "${one_micro}")
string(REGEX REPLACE "^0+" "" two_micro "${two_micro}")
math(EXPR gap "${two_micro} - ${one_micro}")
if(gap LESS 0)
  math(EXPR gap "-${gap}")
endif()
message("final validation loss: one process ${one_val}, two ranks ${two_val} (ZeRO-1 the same "
        "bytes): |gap| ${gap}e-6 <= 1000e-6")
if(gap GREATER 1000)
  message(FATAL_ERROR "the two-rank run's final validation loss is ${gap}e-6 from one process's")
endif()
