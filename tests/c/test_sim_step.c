/*
 * test_sim_step.c - mirza-sim's decode step that grows with the batch
 * (src/sim/step.c, built into this test: the simulator is not part of
 * mirza_core): the step of n sequences, the shapes of the two presets
 * (h100 peaks near 16 and falls; vllm rises and flattens), the shared
 * step clock (a change of the batch's size changes every generation's pace
 * from that moment on, the steps already made kept) and --step-growth's
 * parsing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>

#include "../../src/sim/step.c"

/* Aggregate tokens/s of n sequences: one token of each per step. */
static double rate(const step_curve *c, long n) { return (double)n * 1000.0 / step_ms(c, n); }

static step_curve preset(const char *name) {
  step_curve c = {0};
  double tok_rate = -1;
  assert_int_equal(0, step_parse(name, &c, &tok_rate));
  c.base_ms = tok_rate > 0 ? 1000.0 / tok_rate : 20; /* the default --tok-rate 50 */
  return c;
}

static void test_step(void **state) {
  (void)state;
  step_curve c = {.base_ms = 4, .a = 0.5, .b = 0.01, .knee = 0};
  assert_float_equal(4.51, step_ms(&c, 1), 1e-9);
  assert_float_equal(4 + 5 + 1, step_ms(&c, 10), 1e-9);
  c.knee = 8; /* the first 8 ride along free */
  assert_float_equal(4, step_ms(&c, 1), 1e-9);
  assert_float_equal(4, step_ms(&c, 8), 1e-9);
  assert_float_equal(4 + 1 + 0.04, step_ms(&c, 10), 1e-9);
}

/* The H100 curve: 254 tokens/s at 1, best near 16, below it at 64, lower
 * still at 256, each within 12 % of the measurement. */
static void test_h100_peaks(void **state) {
  (void)state;
  step_curve c = preset("h100");
  const long n[] = {1, 4, 16, 64, 128, 256};
  const double measured[] = {254, 990, 1640, 1400, 1170, 1088};
  for (int i = 0; i < 6; i++) assert_true(fabs(rate(&c, n[i]) / measured[i] - 1) < 0.12);
  long best = 1;
  for (long k = 1; k <= 256; k++)
    if (rate(&c, k) > rate(&c, best)) best = k;
  assert_in_range(best, 12, 20);
  assert_true(rate(&c, 64) < 0.95 * rate(&c, 16));
  assert_true(rate(&c, 256) < 0.75 * rate(&c, 16));
}

/* vLLM's shape: the aggregate rate never falls and flattens toward 1/a. */
static void test_vllm_saturates(void **state) {
  (void)state;
  step_curve c = preset("vllm");
  for (long k = 1; k < 1024; k++) assert_true(rate(&c, k + 1) > rate(&c, k));
  assert_true(rate(&c, 64) > 9 * rate(&c, 4));
  assert_true(rate(&c, 1024) < 1000.0 / c.a);
  assert_true(rate(&c, 1024) > 0.9 * 1000.0 / c.a);
}

/* The clock: steps at 1000 / step(n) a second; a join or a leave first
 * brings it to the moment, so the steps made keep their pace. */
static void test_clock(void **state) {
  (void)state;
  step_curve c = {.base_ms = 10, .a = 10, .b = 0, .knee = 0};
  step_clock k = {0};
  step_advance(&k, &c, 5.0); /* nobody generating: no steps */
  assert_float_equal(0, k.steps, 1e-9);
  k.n = 1; /* a step of 20 ms */
  step_advance(&k, &c, 6.0);
  assert_float_equal(50, k.steps, 1e-9);
  assert_float_equal(6.0 + 0.2, step_due(&k, &c, 60), 1e-9);
  k.n = 3; /* two more join at 6 s: 40 ms a step for all three */
  assert_float_equal(6.0 + 0.4, step_due(&k, &c, 60), 1e-9);
  step_advance(&k, &c, 6.2);
  assert_float_equal(55, k.steps, 1e-9);
  k.n = 1; /* they leave: 20 ms again */
  step_advance(&k, &c, 6.4);
  assert_float_equal(65, k.steps, 1e-9);
  assert_true(step_due(&k, &c, 64) <= k.t); /* reached */
  step_advance(&k, &c, 6.3);                /* time never runs back */
  assert_float_equal(65, k.steps, 1e-9);
}

static void test_parse(void **state) {
  (void)state;
  step_curve c = {0};
  double r = -1;
  assert_int_equal(0, step_parse("0.75", &c, &r));
  assert_float_equal(0.75, c.a, 1e-12);
  assert_float_equal(0, c.b, 1e-12);
  assert_int_equal(0, c.knee);
  assert_float_equal(0, r, 1e-12);
  assert_int_equal(0, step_parse("0.5,0.002,8", &c, &r));
  assert_float_equal(0.002, c.b, 1e-12);
  assert_int_equal(8, c.knee);
  assert_int_equal(0, step_parse("h100", &c, &r));
  assert_float_equal(256, r, 1e-12);
  const char *bad[] = {"", "x", "1,", "1,2,3,4", "-1", "1,2,1.5", "1;2", "1,nan"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) assert_int_equal(-1, step_parse(bad[i], &c, &r));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step),  cmocka_unit_test(test_h100_peaks), cmocka_unit_test(test_vllm_saturates),
      cmocka_unit_test(test_clock), cmocka_unit_test(test_parse),
  };
  return cmocka_run_group_tests(tests, 0, NULL);
}
