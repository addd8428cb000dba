# zig-macos.cmake - CMake toolchain for the macOS cross-build on Linux
# (scripts/cross-macos): zig cc as a Darwin C compiler, the libraries'
# headers, export lists (.tbd) and pkg-config files from a throw-away
# sysroot (cmake/macos/make-sysroot), nothing from this machine's
# /usr/include or /usr/lib.
#   cmake -S . -B build-macos-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/zig-macos.cmake \
#         -DMIRZA_MACOS_ARCH=aarch64 -DMIRZA_MACOS_SYSROOT=DIR -DMIRZA_MACOS_TOOLS=DIR
# MIRZA_MACOS_TOOLS holds zig-cc, zig-ar and zig-ranlib: one-line wrappers
# that scripts/cross-macos writes (`zig cc -target ARCH-macos.13.0` ...).

# try_compile projects read this file again: hand them the same three.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES MIRZA_MACOS_ARCH MIRZA_MACOS_SYSROOT MIRZA_MACOS_TOOLS)
foreach(v MIRZA_MACOS_ARCH MIRZA_MACOS_SYSROOT MIRZA_MACOS_TOOLS)
  if(NOT ${v})
    message(FATAL_ERROR "zig-macos.cmake: set ${v} (scripts/cross-macos does)")
  endif()
endforeach()

set(CMAKE_SYSTEM_NAME Darwin)
set(CMAKE_SYSTEM_VERSION 22.0) # Darwin 22 = macOS 13, the oldest we build for
if(MIRZA_MACOS_ARCH STREQUAL "aarch64")
  set(CMAKE_SYSTEM_PROCESSOR arm64) # what uname -m says on Apple Silicon
else()
  set(CMAKE_SYSTEM_PROCESSOR x86_64)
endif()

set(CMAKE_C_COMPILER ${MIRZA_MACOS_TOOLS}/zig-cc)
set(CMAKE_AR ${MIRZA_MACOS_TOOLS}/zig-ar CACHE FILEPATH "zig's llvm-ar: Darwin-format archives")
set(CMAKE_RANLIB ${MIRZA_MACOS_TOOLS}/zig-ranlib CACHE FILEPATH "zig's llvm-ranlib")
# No SDK, no Xcode: CMake must not look for one (zig brings macOS's libc).
set(CMAKE_OSX_SYSROOT "" CACHE PATH "" FORCE)
set(CMAKE_OSX_DEPLOYMENT_TARGET "" CACHE STRING "" FORCE)

# Headers and libraries only from the sysroot; programs (pkg-config,
# busted) from this machine.
set(CMAKE_FIND_ROOT_PATH ${MIRZA_MACOS_SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# pkg_check_modules sees the sysroot's .pc files alone.
set(ENV{PKG_CONFIG_LIBDIR} ${MIRZA_MACOS_SYSROOT}/usr/lib/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
