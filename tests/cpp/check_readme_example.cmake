# Fails unless README.md contains readme_example.cpp verbatim (inside its ```cpp block).
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "```cpp\n${example}```" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md's C++ example differs from ${EXAMPLE}; copy the file into the README's ```cpp block")
endif()
