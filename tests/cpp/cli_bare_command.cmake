# `microscale` with no arguments prints the help (exit 0) and writes nothing: run in an empty
# WORKDIR, which must stay empty.
file(REMOVE_RECURSE "${WORKDIR}")
file(MAKE_DIRECTORY "${WORKDIR}")
execute_process(COMMAND "${CLI}" WORKING_DIRECTORY "${WORKDIR}" TIMEOUT 60
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(GLOB left "${WORKDIR}/*")
if(left)
  message(FATAL_ERROR "bare microscale left files behind: ${left}")
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bare microscale exited ${rc}\n${out}\n${err}")
endif()
if(NOT out MATCHES "Usage: microscale \\[OPTIONS\\] \\[?SUBCOMMAND" OR NOT out MATCHES "\n +eval ")
  message(FATAL_ERROR "bare microscale did not print the help with its subcommands:\n${out}")
endif()
