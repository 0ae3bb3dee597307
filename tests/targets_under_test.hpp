// Which backend configurations the test suites run (shared by tests/cpp and tests/cpu).
#pragma once

#include <cstdlib>
#include <sstream>
#include <string>

namespace microscale_tests {

// MICROSCALE_TEST_TARGETS="reference neon ..." limits the suites to the named configurations
// ("reference" and CPU target names). scripts/test-arm.sh sets it so that each emulated CPU
// runs only what no other emulated CPU already covers (neon once, sve/sve2 at both vector
// lengths); unset, every configuration the machine offers is tested.
inline bool under_test(const std::string& name) {
  const char* list = std::getenv("MICROSCALE_TEST_TARGETS");
  if (list == nullptr || *list == '\0') return true;
  std::istringstream words(list);
  for (std::string w; words >> w;)
    if (w == name) return true;
  return false;
}

}  // namespace microscale_tests
