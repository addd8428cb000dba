/*
 * test_ready.c - the client's ready list (mz_client_wait_ready and
 * mz_client_ready), the primitive a scheduler uses to wake only the streams
 * that changed. Real transfers over loopback against a mirza-sim child
 * process ($MIRZA_SIM, set by ctest; the tests skip without it).
 *
 * Timing: a "slow" stream has a first-token delay of several seconds and
 * the assertions happen long before it, so a loaded machine cannot make a
 * slow stream ready by accident; every wait has a generous deadline.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "client_int.h" /* the queue memory of one stream (test_scheduler_reuses_memory) */

static pid_t sim_pid;
static char url[128];

static void nap_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

/* Start mirza-sim on a free port; its port comes back through a file. */
static int start_sim(void **state) {
  (void)state;
  const char *bin = getenv("MIRZA_SIM");
  if (!bin || !*bin) return 0;
  char port_file[64];
  snprintf(port_file, sizeof port_file, "/tmp/mz-ready-%d.port", (int)getpid());
  unlink(port_file);
  sim_pid = fork();
  if (sim_pid == 0) {
    execl(bin, bin, "--port", "0", "--port-file", port_file, "--parallel", "256", "--quiet", "--heartbeat-ms", "0",
          (char *)NULL);
    _exit(127);
  }
  for (int i = 0; i < 1000; i++) {
    FILE *f = fopen(port_file, "r");
    int port = 0;
    if (f) {
      if (fscanf(f, "%d", &port) != 1) port = 0;
      fclose(f);
    }
    if (port > 0) {
      snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/chat/completions", port);
      unlink(port_file);
      return 0;
    }
    nap_ms(10);
  }
  return -1;
}

static int stop_sim(void **state) {
  (void)state;
  if (sim_pid > 0) {
    kill(sim_pid, SIGTERM);
    waitpid(sim_pid, NULL, 0);
  }
  return 0;
}

/* A streamed chat request answering `text` after ttft_ms, at `rate`
 * tokens per second (0: at once). */
static mz_stream *open_rate(mz_client *c, const char *text, int ttft_ms, double rate) {
  char body[512], err[128];
  snprintf(body, sizeof body,
           "{\"model\":\"x\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
           "\"mirza_sim\":{\"text\":\"%s\",\"ttft_ms\":%d,\"tok_rate\":%g}}",
           text, ttft_ms, rate);
  mz_request r = {.url = url, .body = body, .body_len = strlen(body)};
  mz_stream *s = mz_stream_open(c, &r, err, sizeof err);
  assert_non_null(s);
  return s;
}

static mz_stream *open_chat(mz_client *c, const char *text, int ttft_ms) { return open_rate(c, text, ttft_ms, 0); }

#define SKIP_WITHOUT_SIM()                                                                                             \
  do {                                                                                                                 \
    if (!url[0]) skip();                                                                                               \
  } while (0)

/* Wait (up to 20 s) until `s` finished, taking the ready list as we go
 * (at least once, and after the last wait). */
static void wait_finished(mz_client *c, mz_stream *s) {
  mz_stream *out[8];
  double end = mz_now() + 20;
  do {
    mz_client_wait_ready(c, 100);
    while (mz_client_ready(c, out, 8) > 0) {}
  } while (!mz_stream_finished(s) && mz_now() < end);
  assert_true(mz_stream_finished(s));
}

/* Drive every transfer (taking nothing off the ready list) until `s`
 * finished; mz_client_wait() would return at once while any stream has
 * events queued, so sleep in small steps instead. */
static void drive_until_finished(mz_client *c, mz_stream *s) {
  double end = mz_now() + 20;
  while (!mz_stream_finished(s) && mz_now() < end) mz_client_sleep(c, 10);
  assert_true(mz_stream_finished(s));
}

/* Only the stream that received something is listed, once. */
static void test_lists_only_ready(void **state) {
  (void)state;
  SKIP_WITHOUT_SIM();
  mz_client *c = mz_client_new(NULL);
  mz_stream *slow = open_chat(c, "slow", 8000), *fast = open_chat(c, "a b c d e f", 0);
  mz_stream *out[4] = {0};
  assert_int_equal(1, mz_client_wait_ready(c, 20000));
  wait_finished(c, fast);                          /* many events queued: listed once at most */
  assert_int_equal(0, mz_client_ready(c, out, 4)); /* taken above already */
  assert_int_equal(0, mz_stream_finished(slow));
  assert_true(mz_stream_pending(fast) > 1);
  mz_stream_close(slow);
  mz_stream_close(fast);
  mz_client_free(c);
}

/* Edge, not level: events reported once are not reported again, so a
 * scheduler with a busy task does not spin; a new event lists it again. */
static void test_edge_triggered(void **state) {
  (void)state;
  SKIP_WITHOUT_SIM();
  mz_client *c = mz_client_new(NULL);
  mz_stream *slow = open_chat(c, "slow", 8000), *fast = open_chat(c, "x", 0);
  mz_stream *out[4] = {0};
  assert_int_equal(1, mz_client_wait_ready(c, 20000));
  assert_int_equal(1, mz_client_ready(c, out, 4));
  assert_ptr_equal(fast, out[0]);
  wait_finished(c, fast);
  assert_int_equal(0, mz_client_wait_ready(c, 50)); /* nothing new: times out */
  assert_true(mz_client_wait(c, 0) >= 1);           /* while wait() still counts it */
  mz_stream *again = open_chat(c, "y", 0);
  assert_int_equal(1, mz_client_wait_ready(c, 20000));
  assert_int_equal(1, mz_client_ready(c, out, 4));
  assert_ptr_equal(again, out[0]);
  mz_stream_close(again);
  mz_stream_close(slow);
  mz_stream_close(fast);
  mz_client_free(c);
}

/* A text event lists a stream long before its end. */
static void test_event_lists_before_end(void **state) {
  (void)state;
  SKIP_WITHOUT_SIM();
  mz_client *c = mz_client_new(NULL);
  mz_stream *s = open_rate(c, "one two three four five six", 0, 0.2); /* 5 s per token */
  mz_stream *out[2] = {0};
  assert_int_equal(1, mz_client_wait_ready(c, 20000));
  assert_int_equal(1, mz_client_ready(c, out, 2));
  assert_ptr_equal(s, out[0]);
  assert_int_equal(0, mz_stream_finished(s));
  const mz_event *ev;
  assert_int_equal(MZ_NEXT_EVENT, mz_stream_next(s, 0, &ev));
  assert_int_equal(MZ_EV_TEXT, ev->type);
  mz_stream_close(s);
  mz_client_free(c);
}

/* Oldest first, and no more than asked for per call. mz_client_wait()
 * drives without taking anything off the list. */
static void test_fifo_and_batches(void **state) {
  (void)state;
  SKIP_WITHOUT_SIM();
  mz_client *c = mz_client_new(NULL);
  mz_stream *t[3];
  mz_stream *out[4] = {0};
  for (int i = 0; i < 3; i++) {
    t[i] = open_chat(c, "w", 0);
    drive_until_finished(c, t[i]);
  }
  assert_int_equal(2, mz_client_ready(c, out, 2));
  assert_ptr_equal(t[0], out[0]);
  assert_ptr_equal(t[1], out[1]);
  assert_int_equal(1, mz_client_ready(c, out, 4));
  assert_ptr_equal(t[2], out[0]);
  for (int i = 0; i < 3; i++) mz_stream_close(t[i]);
  mz_client_free(c);
}

/* A listed stream that is drained (by next()) or closed before it is
 * taken is not handed out; closing unlinks it (no dangling pointer). */
static void test_drained_and_closed_skipped(void **state) {
  (void)state;
  SKIP_WITHOUT_SIM();
  mz_client *c = mz_client_new(NULL);
  mz_stream *a = open_chat(c, "one", 0), *b = open_chat(c, "two", 0), *d = open_chat(c, "three", 0);
  drive_until_finished(c, a);
  drive_until_finished(c, b);
  drive_until_finished(c, d);
  const mz_event *ev;
  while (mz_stream_next(a, 0, &ev) == MZ_NEXT_EVENT) {}
  mz_stream_close(b);
  mz_stream *out[4] = {0};
  assert_int_equal(1, mz_client_ready(c, out, 4));
  assert_ptr_equal(d, out[0]);
  assert_int_equal(0, mz_client_ready(c, out, 4));
  mz_stream_close(a);
  mz_stream_close(d);
  mz_client_free(c);
}

/* An idle client with no timeout returns at once instead of hanging. */
static void test_idle_returns(void **state) {
  (void)state;
  mz_client *c = mz_client_new(NULL);
  mz_stream *out[1];
  double t0 = mz_now();
  assert_int_equal(0, mz_client_wait_ready(c, -1));
  assert_int_equal(0, mz_client_ready(c, out, 1));
  assert_true(mz_now() - t0 < 5.0);
  assert_int_equal(0, mz_client_wait_ready(c, 30)); /* a finite wait sleeps its time */
  assert_true(mz_now() - t0 >= 0.029);
  mz_client_free(c);
}

/* A scheduler's reader (wait for the ready list, then pop what is pending,
 * as next_batch does in a task) keeps a stream's queue memory at the size
 * of one burst, not of the response: the pop that drains the queue resets
 * it, although the next pushes come before the next pop: 64 items and
 * 1 KiB of arena. (Reset at the next pop instead, the queue was never seen
 * drained: 4,000 paced tokens grew it to 8,192 items and a 32 KiB arena
 * holding all 25 KB of their text.) */
static void test_scheduler_reuses_memory(void **state) {
  (void)state;
  SKIP_WITHOUT_SIM();
  enum { TOKENS = 4000 };
  char body[512], err[128];
  snprintf(body, sizeof body,
           "{\"model\":\"x\",\"stream\":true,\"max_tokens\":%d,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
           "\"mirza_sim\":{\"answer_tokens\":%d,\"tok_rate\":4000,\"ttft_ms\":0}}",
           TOKENS + 10, TOKENS);
  mz_client *c = mz_client_new(NULL);
  mz_request r = {.url = url, .body = body, .body_len = strlen(body)};
  mz_stream *s = mz_stream_open(c, &r, err, sizeof err), *out[4];
  assert_non_null(s);
  const mz_event *e;
  size_t texts = 0, bytes = 0;
  int done = 0;
  double end = mz_now() + 60;
  while (!done && mz_now() < end) {
    mz_client_wait_ready(c, 100);
    while (mz_client_ready(c, out, 4) > 0) {}
    while (!done && mz_stream_pending(s) && mz_stream_next(s, 0, &e) == MZ_NEXT_EVENT) {
      if (e->type == MZ_EV_TEXT) texts++, bytes += e->len;
      done = e->type == MZ_EV_DONE || e->type == MZ_EV_ERROR;
    }
  }
  assert_true(done);
  assert_int_equal(texts, TOKENS);
  assert_true(s->qcap <= TOKENS / 2);     /* a burst of 2,000 tokens would be a 0.5 s stall */
  assert_true(s->arena.cap <= bytes / 2); /* the response's text never all in memory at once */
  mz_stream_close(s);
  mz_client_free(c);
}

/* Wait (up to the deadline) until every socket of s[0..n) has bytes
 * waiting to be read. */
static void wait_all_readable(mz_stream **s, int n, double end) {
  struct pollfd p[256];
  assert_true(n <= 256);
  int readable = 0;
  while (readable < n && mz_now() < end) {
    for (int i = 0; i < n; i++) /* a socket libcurl has not (re)registered yet: -1, never ready */
      p[i] = (struct pollfd){.fd = s[i]->sock != CURL_SOCKET_BAD ? s[i]->sock : -1, .events = POLLIN};
    if (poll(p, (nfds_t)n, 100) < 0) continue;
    readable = 0;
    for (int i = 0; i < n; i++) readable += (p[i].revents & POLLIN) != 0;
  }
  assert_int_equal(n, readable);
}

/* A long answer at 20 tokens/s (10 s): more keeps coming while a test looks. */
static const char PACED_BODY[] =
    "{\"model\":\"x\",\"stream\":true,\"max_tokens\":210,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
    "\"mirza_sim\":{\"answer_tokens\":200,\"tok_rate\":20,\"ttft_ms\":0}}";

/* Wait (up to the deadline) until every answer of s[0..n) is under way,
 * its first token read, then take what they queued: what comes next is
 * held (a hold starts on an empty queue). */
static void answers_under_way(mz_client *c, mz_stream **s, int n, double end) {
  mz_stream *out[16];
  const mz_event *ev;
  int started = 0;
  while (started < n && mz_now() < end) {
    mz_client_wait_ready(c, 100);
    while (mz_client_ready(c, out, 16) > 0) {}
    started = 0;
    for (int i = 0; i < n; i++) started += s[i]->first_at > 0;
  }
  assert_int_equal(n, started);
  for (int i = 0; i < n; i++)
    while (mz_stream_pending(s[i]) && mz_stream_next(s[i], 0, &ev) == MZ_NEXT_EVENT) {}
}

/* How many of s[0..n) had bytes read since `since`. */
static int read_since(mz_stream **s, int n, double since) {
  int k = 0;
  for (int i = 0; i < n; i++) k += s[i]->last_rx >= since;
  return k;
}

/* A scheduler's look reads every socket that is ready, not only the first
 * MZ_FIRED_MAX (64) that one wait reports: with 150 paced streams whose
 * sockets all hold unread bytes, one look at the tick reads them all.
 * (Reading 64 per look, the rest waited for the next tick, and the next:
 * 256 streams were each read every fourth tick, and a batch item's end
 * was seen up to that late.) */
static void test_look_reads_every_ready_socket(void **state) {
  (void)state;
  SKIP_WITHOUT_SIM();
  enum { N = 150 };
  char err[128];
  mz_client *c = mz_client_new(NULL);
  mz_request r = {.url = url, .body = PACED_BODY, .body_len = strlen(PACED_BODY), .hold_ms = 60000};
  mz_stream *s[N];
  for (int i = 0; i < N; i++) {
    s[i] = mz_stream_open(c, &r, err, sizeof err);
    assert_non_null(s[i]);
  }
  double end = mz_now() + 30;
  answers_under_way(c, s, N, end);
  /* a tick's look (no wait): every socket with bytes waiting is read */
  wait_all_readable(s, N, end);
  double before = mz_now();
  mz_client_wait_ready_paced(c, 0, 100);
  assert_int_equal(N, read_since(s, N, before));
  for (int i = 0; i < N; i++) mz_stream_close(s[i]);
  mz_client_free(c);
}

/* A scheduler's wait pauses a whole tick between looks while streams hold
 * what came: a hold that ends meanwhile (or a stall clock) is seen at the
 * next look, not by a look of its own. (Cut short at each such deadline,
 * with many streams holding one was due every few milliseconds and each
 * look read every socket: 256 batch items were read 15 times each in 2 s
 * where 8 ticks read them 9-11 times.) */
static void test_paced_wait_not_cut_by_a_hold(void **state) {
  (void)state;
  SKIP_WITHOUT_SIM();
  char err[128];
  mz_client *c = mz_client_new(NULL);
  mz_request ra = {.url = url, .body = PACED_BODY, .body_len = strlen(PACED_BODY), .hold_ms = 300};
  mz_request rb = ra;
  rb.hold_ms = 60000;
  mz_stream *s[2] = {mz_stream_open(c, &ra, err, sizeof err), mz_stream_open(c, &rb, err, sizeof err)};
  assert_non_null(s[0]);
  assert_non_null(s[1]);
  double end = mz_now() + 20;
  answers_under_way(c, s, 2, end);
  wait_all_readable(s, 2, end); /* the first look reads both: their holds begin (a's ends 300 ms later) */
  double t0 = mz_now();
  assert_int_equal(1, mz_client_wait_ready_paced(c, 5000, 1000));
  assert_true(mz_ready(s[0])); /* its hold over */
  assert_true(mz_now() - t0 >= 0.9);
  for (int i = 0; i < 2; i++) mz_stream_close(s[i]);
  mz_client_free(c);
}

/* A pause (the scheduler's tick) sends the request of a stream opened
 * since the last wait before it sleeps: the daemon works through the
 * tick instead of getting the request a tick later. On a kept connection
 * the request is out when the pause returns. */
static void test_pause_sends_new_requests(void **state) {
  (void)state;
  SKIP_WITHOUT_SIM();
  mz_client *c = mz_client_new(NULL);
  mz_stream *a = open_chat(c, "w", 0);
  drive_until_finished(c, a); /* its connection is kept for the next */
  mz_stream_close(a);
  mz_stream *b = open_chat(c, "x", 5000); /* its answer long after the pause */
  long sent = -1;
  assert_int_equal(CURLE_OK, curl_easy_getinfo(b->easy, CURLINFO_REQUEST_SIZE, &sent));
  assert_int_equal(0, sent);
  assert_int_equal(0, mz_client_pause(c, 1));
  assert_int_equal(CURLE_OK, curl_easy_getinfo(b->easy, CURLINFO_REQUEST_SIZE, &sent));
  assert_true(sent > 0);
  mz_stream_close(b);
  mz_client_free(c);
}

/* Open `body` on a new connection and check that the pauses alone connect,
 * ask and read it until its answer begins (its first delta, text or tool
 * call); with `paced` (a delta every 250 ms), that they read it no more:
 * what comes next waits in the socket. */
static void check_fresh_only(const char *body, int paced) {
  char err[128];
  mz_client *c = mz_client_new(NULL);
  mz_request r = {.url = url, .body = body, .body_len = strlen(body)};
  mz_stream *b = mz_stream_open(c, &r, err, sizeof err);
  assert_non_null(b);
  double end = mz_now() + 5; /* needs one pause: a broken build fails soon */
  int pauses = 0;
  while (!b->answering && mz_now() < end) { /* pauses only, no wait */
    mz_client_pause(c, 1000);
    pauses++;
  }
  assert_true(b->answering);
  /* connected, asked and answered in the first second's pause. (Left to
   * libcurl's own timers, the connection was made at the next pause's
   * start; not read in a pause at all, the answer came after 10 s.) */
  assert_int_equal(1, pauses);
  if (paced) {
    /* its next deltas come every 250 ms: at the end of a second's pause
     * they wait unread (read as they came, the socket would be empty) */
    assert_int_equal(0, mz_client_pause(c, 1000));
    struct pollfd q = {.fd = b->sock, .events = POLLIN};
    assert_int_equal(1, poll(&q, 1, 0));
  }
  mz_stream_close(b);
  mz_client_free(c);
}

/* A pause serves the streams still waiting for their answer as their
 * sockets come ready, and only those: a new connection is made and asked,
 * the first token is timed to its read, not to the scheduler's tick (a
 * batch record's ttft_ms), while a stream under way keeps what comes in
 * its socket for the next look. An answer of tool calls alone begins too. */
static void test_pause_reads_only_fresh_streams(void **state) {
  (void)state;
  SKIP_WITHOUT_SIM();
  check_fresh_only("{\"model\":\"x\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                   "\"mirza_sim\":{\"answer_tokens\":40,\"ttft_ms\":0,\"tok_rate\":4}}",
                   1);
  check_fresh_only("{\"model\":\"x\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                   "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
                   "\"mirza_sim\":{\"ttft_ms\":0,\"tok_rate\":4,\"tool_calls\":[{\"name\":\"f\",\"arguments\":"
                   "\"{\\\"city\\\": \\\"Paris, Ile-de-France, France, Europe, the Earth, the Solar System\\\"}\"}]}}",
                   0); /* the calls come at once */
}

/* A pause ends when a stream it serves ends, so a ticking scheduler hands
 * a short answer over and sends the next item at once, not a tick later:
 * an answer of a few tokens at once, and one paced 5 ms a token opened as
 * a short answer (served to its end). Paced and not short, it is not read
 * after its first token: its end waits for the look (the pause runs to
 * its end). */
static void check_pause_ends_with(double rate, int short_answer, int ends) {
  char body[512], err[128];
  snprintf(body, sizeof body,
           "{\"model\":\"x\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
           "\"mirza_sim\":{\"text\":\"a b c\",\"ttft_ms\":0,\"tok_rate\":%g}}",
           rate);
  mz_client *c = mz_client_new(NULL);
  mz_request r = {.url = url, .body = body, .body_len = strlen(body), .short_answer = short_answer};
  mz_stream *s = mz_stream_open(c, &r, err, sizeof err);
  assert_non_null(s);
  unsigned long ended = mz_client_ended(c);
  double t0 = mz_now();
  assert_int_equal(0, mz_client_pause(c, ends ? 20000 : 1000));
  if (ends) {
    assert_true(mz_now() - t0 < 15); /* 20 s when it is not cut short */
    assert_int_equal(ended + 1, mz_client_ended(c));
    assert_true(mz_stream_finished(s));
    assert_true(mz_ready(s)); /* listed: the scheduler takes it without a look */
  } else {
    assert_true(mz_now() - t0 >= 0.9);
    assert_int_equal(ended, mz_client_ended(c));
  }
  mz_stream_close(s);
  mz_client_free(c);
}

static void test_pause_ends_with_a_stream(void **state) {
  (void)state;
  SKIP_WITHOUT_SIM();
  check_pause_ends_with(0, 0, 1);   /* at once */
  check_pause_ends_with(200, 1, 1); /* 5 ms a token, a short answer: served to its end */
  check_pause_ends_with(200, 0, 0); /* the same, not short: read at the looks */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lists_only_ready),
      cmocka_unit_test(test_edge_triggered),
      cmocka_unit_test(test_event_lists_before_end),
      cmocka_unit_test(test_fifo_and_batches),
      cmocka_unit_test(test_drained_and_closed_skipped),
      cmocka_unit_test(test_idle_returns),
      cmocka_unit_test(test_scheduler_reuses_memory),
      cmocka_unit_test(test_look_reads_every_ready_socket),
      cmocka_unit_test(test_paced_wait_not_cut_by_a_hold),
      cmocka_unit_test(test_pause_sends_new_requests),
      cmocka_unit_test(test_pause_reads_only_fresh_streams),
      cmocka_unit_test(test_pause_ends_with_a_stream),
  };
  return cmocka_run_group_tests(tests, start_sim, stop_sim);
}
