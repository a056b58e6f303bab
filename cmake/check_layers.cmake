# cmake/check_layers.cmake — the one table of dissect's header layers, and the check that no
# header includes one from a higher layer. Run by ctest (layer_order):
#
#   cmake -DINCLUDE_DIR=<repo>/include -P check_layers.cmake
#
# Each header belongs to the first layer whose pattern matches its path below include/dissect/
# (a regular expression, anchored at both ends). A header may include headers of its own layer
# or of a lower one. A header that no pattern matches is an error too: a new header takes its
# place in this table (and in docs/architecture.md's picture) before it lands.
cmake_minimum_required(VERSION 3.21)

if(NOT DEFINED INCLUDE_DIR)
  message(FATAL_ERROR "check_layers.cmake: INCLUDE_DIR is not set")
endif()
# A relative INCLUDE_DIR (-DINCLUDE_DIR=include) is taken from the working directory; left
# relative, the glob below finds nothing and the check would pass without checking anything.
get_filename_component(INCLUDE_DIR "${INCLUDE_DIR}" ABSOLUTE)

# Lowest first. A layer is one or more folders, one pattern each. "umbrella" holds the headers that
# only gather others (dissect.hpp, blocks.hpp, lora.hpp) and the forwarding headers kept for one
# release after a move (every other header directly under include/dissect/, and the few listed
# inside folders); they may include anything.
set(layer_names core accounting tensor kernels layers attention training decoding blocks models
                transforms io text parallel umbrella)
set(layer_umbrella "[^/]+\\.hpp" "quant/quantize\\.hpp" "io/half\\.hpp" "linear/weight_storage\\.hpp")
set(layer_core "core/.*" "numeric/.*")
set(layer_accounting "accounting/.*")
set(layer_tensor "tensor/.*")
set(layer_kernels "kernels/.*" "quant/.*")
set(layer_layers "layers/.*")
set(layer_attention "attention/.*")
set(layer_training "training/.*")
set(layer_decoding "decoding/.*")
set(layer_blocks "blocks/.*")
set(layer_models "models/.*")
set(layer_transforms "transforms/.*")
set(layer_io "io/.*")
set(layer_text "text/.*")
set(layer_parallel "parallel/.*")

# The layer index of `path` (relative to include/dissect), or -1.
function(layer_of path out)
  # The umbrella layer is matched first: its forwarding headers sit in other layers' folders.
  list(LENGTH layer_names count)
  math(EXPR last "${count} - 1")
  foreach(pattern IN LISTS layer_umbrella)
    if(path MATCHES "^${pattern}$")
      set(${out} ${last} PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(index 0)
  foreach(name IN LISTS layer_names)
    foreach(pattern IN LISTS layer_${name})
      if(path MATCHES "^${pattern}$")
        set(${out} ${index} PARENT_SCOPE)
        return()
      endif()
    endforeach()
    math(EXPR index "${index} + 1")
  endforeach()
  set(${out} -1 PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE headers RELATIVE "${INCLUDE_DIR}/dissect" "${INCLUDE_DIR}/dissect/*.hpp")
list(SORT headers)
set(problems "")
foreach(header IN LISTS headers)
  layer_of("${header}" own)
  if(own EQUAL -1)
    string(APPEND problems "  ${header}: in no layer (add it to cmake/check_layers.cmake)\n")
    continue()
  endif()
  list(GET layer_names ${own} own_name)
  file(STRINGS "${INCLUDE_DIR}/dissect/${header}" lines REGEX "^#include \"dissect/")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^#include \"dissect/([^\"]+)\".*" "\\1" target "${line}")
    layer_of("${target}" theirs)
    if(theirs GREATER own)
      list(GET layer_names ${theirs} their_name)
      string(APPEND problems
             "  ${header} (${own_name}) includes ${target} (${their_name}, a higher layer)\n")
    endif()
  endforeach()
endforeach()

list(LENGTH headers count)
if(count EQUAL 0)
  message(FATAL_ERROR "check_layers: no headers under ${INCLUDE_DIR}/dissect")
endif()
if(problems)
  message(FATAL_ERROR "check_layers: include order broken:\n${problems}")
endif()
message(STATUS "check_layers: ${count} headers, every include runs down the layers")
