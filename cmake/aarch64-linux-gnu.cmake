# Cross-compiles for aarch64 Linux on Debian (multiarch): g++-aarch64-linux-gnu, the :arm64 -dev
# packages (libhwy-dev:arm64, libgtest-dev:arm64) and qemu-user-static to run what was built.
#   cmake -S . -B build-arm -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# The emulated CPU is MICROSCALE_QEMU_CPU (a -cpu argument such as "max,sve=off" or
# "max,sve256=on"); left empty, QEMU reads $QEMU_CPU when each program runs, else emulates "max"
# (SVE2 with 512-bit vectors), so one build can be tested on several CPUs.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# The arm64 packages live beside the host's under /usr: search /usr/lib/aarch64-linux-gnu (and
# its cmake/ package configs, GTest's among them) instead of the host's multiarch directory.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# pkg-config (pkg_check_modules(HWY ... libhwy)) must read the arm64 .pc files, not the host's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
unset(ENV{PKG_CONFIG_PATH})

# ctest and gtest_discover_tests run the test programs through QEMU. -L makes the loader the
# cross toolchain's (libc6-arm64-cross); LD_LIBRARY_PATH makes libc, libstdc++ and libgomp come
# from there too, rather than from libc6:arm64 that ld.so.cache lists: a loader and a libc from
# different glibc builds hang in the first pthread_create.
set(MICROSCALE_QEMU_CPU "" CACHE STRING "QEMU -cpu model for running aarch64 programs (empty: $QEMU_CPU or max)")
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static -L /usr/aarch64-linux-gnu
                                  -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib)
if(MICROSCALE_QEMU_CPU)
  list(APPEND CMAKE_CROSSCOMPILING_EMULATOR -cpu ${MICROSCALE_QEMU_CPU})
endif()
