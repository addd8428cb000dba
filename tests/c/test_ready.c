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
#include <math.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "client_int.h" /* the queue memory of one stream (test_scheduler_reuses_memory), the read rule */
#include "watch.h"

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

/* When a stream is read (client.c's rule, due.c): a stream of `tokens`
 * paced at `rate`, its reader holding `hold_ms` (0: taking each event),
 * driven to its end; the number of socket reads it took. */
static size_t reads_of(int tokens, double rate, long hold_ms) {
  char body[512], err[128];
  snprintf(body, sizeof body,
           "{\"model\":\"x\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
           "\"mirza_sim\":{\"answer_tokens\":%d,\"ttft_ms\":0,\"tok_rate\":%g}}",
           tokens, rate);
  mz_client *c = mz_client_new(NULL);
  mz_request r = {.url = url, .body = body, .body_len = strlen(body), .hold_ms = hold_ms};
  mz_stream *s = mz_stream_open(c, &r, err, sizeof err);
  assert_non_null(s);
  wait_finished(c, s);
  size_t n = s->reads;
  mz_stream_close(s);
  mz_client_free(c);
  return n;
}

/* A reader that takes each event gets each token as it is read: its socket
 * is read as bytes come, about once a token. Held (a batch item, a
 * collect), the answer is read at most an eighth of its age late: the
 * reads thin out (120 tokens at 100/s, 1.2 s: about 30 reads; a read per
 * token when broken). */
static void test_held_streams_read_less(void **state) {
  (void)state;
  SKIP_WITHOUT_SIM();
  size_t eager = reads_of(120, 100, 0), lazy = reads_of(120, 100, 60000);
  assert_true(eager >= 80);
  assert_true(lazy <= 60);
}

/* A stream built by hand on a socket pair (sv[0] its socket, watched for
 * input), for the read rule alone: libcurl has nothing to do. */
static mz_stream *hand_stream(mz_client *c, int sv[2]) {
  assert_int_equal(0, socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
  mz_stream *s = calloc(1, sizeof *s);
  assert_non_null(s);
  s->c = c, s->sock = sv[0], s->sock_what = CURL_POLL_IN, s->easy = (CURL *)c, s->due_at = INFINITY;
  assert_int_equal(0, mz_watch_set(c->watch, sv[0], CURL_POLL_IN));
  return s;
}

/* hand_stream's stream gone, its sockets and client closed. */
static void hand_stream_free(mz_client *c, mz_stream *s, int sv[2]) {
  mz_due_drop(s);
  mz_watch_set(c->watch, sv[0], CURL_POLL_REMOVE);
  free(s);
  close(sv[0]);
  close(sv[1]);
  mz_client_free(c);
}

/* The gaps of a held stream (due.c): its end is looked for at an eighth of
 * how long it has answered past its first 16 ms, at most its hold, 250 ms
 * and a quarter of its stall timeout (at a grid point between 3/4 of that
 * and that); none below 2 ms (an answer of 30 ms, whose 4th token at 100/s
 * is its last, is read as it comes), none while it has no answer, none
 * without a hold, none on a shared (HTTP/2) connection. Its middle is read
 * every min(hold, 250 ms, stall / 4), or at the end's gap when its socket
 * cannot be looked into (TLS). A lazy stream's socket is parked: no wait
 * reports it; unparked, it is watched again. A stream built by hand on a
 * socket pair: the rule alone. */
static void test_read_gap(void **state) {
  (void)state;
  mz_client *c = mz_client_new(NULL);
  int sv[2];
  mz_stream *s = hand_stream(c, sv);
  struct {
    int answering, multiplexed, sealed;
    double hold, stall, age, gap, middle; /* gap 0: read as its bytes come */
  } cases[] = {
      {1, 0, 0, 60, 0, 0.816, 0.1, 0.25},  {1, 0, 0, 60, 0, 8, 0.25, 0.25},   {1, 0, 0, 0.05, 0, 0.8, 0.05, 0.05},
      {1, 0, 0, 60, 0.2, 0.8, 0.05, 0.05}, {1, 0, 1, 60, 0, 0.816, 0.1, 0.1}, {1, 0, 0, 1, 0, 0.056, 0.005, 0.25},
      {1, 0, 0, 60, 0, 0.008, 0, 0},       {1, 0, 0, 60, 0, 0.030, 0, 0},     {0, 0, 0, 60, 0, 0.8, 0, 0},
      {1, 0, 0, 0, 0, 0.8, 0, 0},          {1, 1, 0, 60, 0, 0.8, 0, 0},
  };
  mz_fired f[MZ_FIRED_MAX];
  int woken = 0, eintr = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    double now = mz_now();
    s->answering = cases[i].answering, s->multiplexed = cases[i].multiplexed, s->sealed = cases[i].sealed;
    s->hold_s = cases[i].hold, s->stall_s = cases[i].stall, s->answer_at = now - cases[i].age;
    mz_due_read(c, s, now);
    assert_int_equal(cases[i].gap > 0, s->parked);
    if (!s->parked) continue;
    /* on the grids of the streams of a like gap: no later than the gap, no
     * sooner than three quarters of it */
    double end = s->peek_at < s->read_at ? s->peek_at : s->read_at, g = cases[i].gap, m = cases[i].middle;
    assert_true(end <= now + g + 1e-9 && end > now + g * 3 / 4);
    assert_true(s->read_at <= now + m + 1e-9 && s->read_at > now + m * 3 / 4);
    assert_true(mz_due_next(c) == end);
    assert_int_equal(1, write(sv[1], "x", 1)); /* parked: no wait reports it */
    assert_int_equal(0, mz_watch_wait(c->watch, 0, f, &woken, &eintr));
    mz_due_unpark(c, s); /* watched again */
    assert_false(s->parked);
    assert_int_equal(1, mz_watch_wait(c->watch, 0, f, &woken, &eintr));
    assert_int_equal(sv[0], f[0].fd);
    char b;
    assert_int_equal(1, read(sv[0], &b, 1));
    mz_due_drop(s);
  }
  hand_stream_free(c, s, sv);
}

/* A parked stream's end is looked for without reading it (due.c): worth
 * reading when the chunked body's last chunk is there, "[DONE]", the peer
 * closed, or a buffer's worth came; not for the middle of an answer.
 * Nothing is taken from the socket. */
static void test_worth_reading(void **state) {
  (void)state;
  static const struct {
    const char *bytes;
    int worth;
  } cases[] = {
      {"", 0},
      {"1c\r\ndata: {\"choices\":[]}\n\n\r\n", 0},
      {"1c\r\ndata: {\"choices\":[]}\n\n\r\n1c\r\ndata: {\"choices\":[]}\n\n\r\n", 0},
      {"1c\r\ndata: {\"choices\":[]}\n\n\r\n0\r\n\r\n", 1},
      {"0\r\n\r\n", 1},
      {"e\r\ndata: [DONE]\n\n\r\n", 1},
      {"data: [DONE]\n\n", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    int sv[2];
    assert_int_equal(0, socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    size_t n = strlen(cases[i].bytes);
    if (n) assert_int_equal((ssize_t)n, write(sv[1], cases[i].bytes, n));
    assert_int_equal(cases[i].worth, mz_due_worth_reading(sv[0]));
    char b[256];
    if (n) assert_int_equal((ssize_t)n, recv(sv[0], b, sizeof b, MSG_DONTWAIT)); /* all still there */
    close(sv[1]);
    assert_int_equal(1, mz_due_worth_reading(sv[0])); /* closed */
    close(sv[0]);
  }
  int sv[2];
  assert_int_equal(0, socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
  static char big[20000];
  memset(big, 'x', sizeof big);
  /* 15 KB of a middle (what 250 ms bring at 200 tokens/s): its tail is
   * seen, no end there, no read yet */
  assert_int_equal(15000, write(sv[1], big, 15000));
  assert_int_equal(0, mz_due_worth_reading(sv[0]));
  assert_int_equal((ssize_t)sizeof big, write(sv[1], big, sizeof big)); /* past MZ_PEEK_MAX */
  assert_int_equal(1, mz_due_worth_reading(sv[0]));                     /* a buffer's worth: the tail is out of sight */
  close(sv[0]);
  close(sv[1]);
}

/* A parked stream (due.c) is read at its end's look when its end has come,
 * not at the next read of its middle (250 ms later at most); the middle of
 * an answer waits for that read. A stream built by hand on a socket pair:
 * the driver's reads are counted, libcurl has nothing to do. */
static void test_end_read_when_it_comes(void **state) {
  (void)state;
  mz_client *c = mz_client_new(NULL);
  int sv[2];
  mz_stream *s = hand_stream(c, sv);
  s->answering = 1, s->hold_s = 60;
  c->nfd_rx = (size_t)sv[0] + 1;
  c->fd_rx = calloc(c->nfd_rx, sizeof *c->fd_rx);
  c->fd_owner = calloc(c->nfd_rx, sizeof *c->fd_owner);
  c->fd_owner[sv[0]] = s;
  double now = mz_now();
  s->answer_at = now - 0.2; /* its end looked for every 25 ms, its middle read every 0.25 s */
  mz_due_read(c, s, now);
  assert_true(s->parked && s->peek_at < s->read_at);
  const char mid[] = "1c\r\ndata: {\"choices\":[]}\n\n\r\n", end[] = "0\r\n\r\n";
  assert_int_equal((ssize_t)strlen(mid), write(sv[1], mid, strlen(mid)));
  mz_due_run(c, s->peek_at); /* the middle: left for the read */
  assert_int_equal(0, s->reads);
  assert_true(s->peek_at < s->read_at);
  assert_int_equal((ssize_t)strlen(end), write(sv[1], end, strlen(end)));
  mz_due_run(c, s->peek_at); /* the end: read now */
  assert_int_equal(1, s->reads);
  c->fd_owner[sv[0]] = NULL;
  hand_stream_free(c, s, sv);
}

/* The due heap (due.c) gives the earliest look first, however the keys
 * came (random order, lowered, dropped), and a run takes exactly those
 * due: a wrong order makes holds, stalls and parked reads late or lost. */
static void test_due_heap_order(void **state) {
  (void)state;
  enum { N = 200 };
  mz_client *c = mz_client_new(NULL);
  mz_stream *s[N];
  double key[N];
  unsigned seed = 7;
  double least = INFINITY;
  for (int i = 0; i < N; i++) {
    s[i] = calloc(1, sizeof **s);
    s[i]->c = c, s[i]->due_at = INFINITY, s[i]->sock = CURL_SOCKET_BAD;
    seed = seed * 1103515245u + 12345u;
    double t = key[i] = 1000 + (double)(seed >> 8 & 0xffff);
    mz_due_at(s[i], t);
    mz_due_at(s[i], t + 5); /* later: kept as it was */
    if (t < least) least = t;
    assert_true(mz_due_next(c) == least);
  }
  mz_due_at(s[N / 2], 500); /* lowered: on top */
  assert_true(mz_due_next(c) == 500);
  mz_due_drop(s[N / 2]); /* dropped: the next least */
  assert_true(mz_due_next(c) == least);
  for (double t = 1000; t < 1000 + 0x10000 + 4096; t += 4096) {
    mz_due_run(c, t); /* the fake streams have nothing to look at: each due taken off, no other */
    assert_true(mz_due_next(c) > t);
    for (int i = 0; i < N; i++)
      if (i != N / 2) assert_int_equal(key[i] > t, s[i]->due_pos != 0);
  }
  assert_true(isinf(mz_due_next(c)));
  for (int i = 0; i < N; i++) free(s[i]);
  mz_client_free(c);
}

/* A held answer that was parked (due.c) hands its connection back to
 * libcurl watched (libcurl forgets the socket when the transfer ends, and
 * the watch with it): the next request on it is read (parked, it was never
 * read, and waited for its header timeout). */
static void test_parked_connection_reused(void **state) {
  (void)state;
  SKIP_WITHOUT_SIM();
  const char body[] = "{\"model\":\"x\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                      "\"mirza_sim\":{\"answer_tokens\":30,\"ttft_ms\":0,\"tok_rate\":100}}";
  char err[128];
  mz_client *c = mz_client_new(NULL);
  mz_request r = {.url = url, .body = body, .body_len = strlen(body), .hold_ms = 60000};
  mz_stream *a = mz_stream_open(c, &r, err, sizeof err);
  assert_non_null(a);
  int parked = 0;
  double end = mz_now() + 20;
  while (!mz_stream_finished(a) && mz_now() < end) {
    mz_client_wait_ready(c, 100);
    parked |= a->parked;
  }
  assert_true(parked);
  mz_stream_close(a);
  mz_stream *b = open_chat(c, "again", 200); /* the same connection; its answer comes once libcurl waits for it */
  double t0 = mz_now();
  wait_finished(c, b);
  assert_true(mz_now() - t0 < 10);
  mz_stream_close(b);
  mz_client_free(c);
}

/* A daemon that stops sending in the middle of a held (parked) answer is
 * timed out by the stall clock: the parked stream's reads, bytes or not,
 * do not count as bytes received. */
static void test_parked_stream_stalls(void **state) {
  (void)state;
  SKIP_WITHOUT_SIM();
  const char body[] = "{\"model\":\"x\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                      "\"mirza_sim\":{\"answer_tokens\":100,\"ttft_ms\":0,\"tok_rate\":100,"
                      "\"fault\":\"stall-after=30:30000\"}}";
  char err[128];
  mz_client *c = mz_client_new(NULL);
  mz_request r = {.url = url, .body = body, .body_len = strlen(body), .hold_ms = 60000, .stall_timeout_ms = 1000};
  mz_stream *s = mz_stream_open(c, &r, err, sizeof err);
  assert_non_null(s);
  wait_finished(c, s); /* 20 s at most: the stall is 30 s */
  const mz_event *ev = NULL;
  while (mz_stream_next(s, 0, &ev) == MZ_NEXT_EVENT && ev->type != MZ_EV_ERROR && ev->type != MZ_EV_DONE) {}
  assert_non_null(ev);
  assert_int_equal(MZ_EV_ERROR, ev->type);
  assert_string_equal("timeout", ev->code);
  mz_stream_close(s);
  mz_client_free(c);
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
      cmocka_unit_test(test_held_streams_read_less),
      cmocka_unit_test(test_read_gap),
      cmocka_unit_test(test_worth_reading),
      cmocka_unit_test(test_end_read_when_it_comes),
      cmocka_unit_test(test_due_heap_order),
      cmocka_unit_test(test_parked_connection_reused),
      cmocka_unit_test(test_parked_stream_stalls),
  };
  return cmocka_run_group_tests(tests, start_sim, stop_sim);
}
