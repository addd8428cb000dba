/*
 * fuzz.h - what every fuzz target shares: the libFuzzer entry point and a
 * check that aborts (so libFuzzer, the sanitizers, valgrind and the plain
 * replay driver all report a broken invariant as a crash, with a message).
 *
 * A target is one file defining LLVMFuzzerTestOneInput. It is built twice:
 * with clang -fsanitize=fuzzer (tests/fuzz/fuzz.cmake, MIRZA_FUZZ=ON) to
 * search for new inputs, and with any compiler against replay.c, which runs
 * the saved regression inputs and seeds as an ordinary ctest test.
 */
#ifndef MIRZA_FUZZ_H
#define MIRZA_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                                                          \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);                                         \
      fprintf(stderr, __VA_ARGS__);                                                                                    \
      fputc('\n', stderr);                                                                                             \
      abort();                                                                                                         \
    }                                                                                                                  \
  } while (0)

/* A tiny deterministic PRNG (xorshift32) for choices derived from the
 * input, so one input always runs the same way. */
static inline uint32_t fuzz_next(uint32_t *s) {
  uint32_t x = *s ? *s : 0x9e3779b9u;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return *s = x;
}

#endif
