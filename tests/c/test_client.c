/*
 * test_client.c - client.c (the libcurl multi driver) against a small HTTP
 * server inside the test: a thread with a listening socket on 127.0.0.1
 * that records each request and answers with canned bytes, sent in parts
 * with a pause between them. Lua-free, like the engine it tests.
 *
 * Covered: SSE streams and the non-SSE JSON body fallback, event: error
 * frames, body and event caps, deadline, connect and header timeouts, the
 * stall timer against a slow head, api_key/method/custom headers as the
 * server sees them, pending/finished, and the behaviours of issue 8 that
 * live in C (no [DONE] marker, invalid UTF-8, NUL, error bodies, headers,
 * Retry-After, redirects). Timing asserts are loose upper bounds.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "os.h"

/* ---- the in-test server ---------------------------------------------- */

#define MAX_PARTS 8

typedef struct server {
  int fd, port;
  pthread_t th;
  const char *parts[MAX_PARTS]; /* the answer, sent part by part */
  size_t part_len[MAX_PARTS];   /* 0: strlen */
  int pause_ms;                 /* before each part after the first */
  int hold_ms;                  /* keep the connection open after the answer */
  pthread_mutex_t mu;
  char req[1 << 16]; /* the last request (head and body) */
  size_t req_len;
  int nreq;
} server;

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {}
}

/* Read one request (head, then Content-Length bytes of body). */
static size_t read_request(int c, char *buf, size_t cap) {
  size_t len = 0, want = 0;
  char *end = NULL;
  while (len < cap - 1) {
    ssize_t n = recv(c, buf + len, cap - 1 - len, 0);
    if (n <= 0) break;
    len += (size_t)n;
    buf[len] = '\0';
    if (!end && (end = strstr(buf, "\r\n\r\n"))) {
      const char *cl = strcasestr(buf, "\r\nContent-Length:");
      want = (size_t)(end + 4 - buf) + (cl && cl < end ? strtoul(cl + 17, NULL, 10) : 0);
    }
    if (end && len >= want) break;
  }
  return len;
}

static void answer(server *s, int c) {
  char buf[sizeof s->req];
  size_t n = read_request(c, buf, sizeof buf);
  pthread_mutex_lock(&s->mu);
  memcpy(s->req, buf, n + 1);
  s->req_len = n;
  s->nreq++;
  pthread_mutex_unlock(&s->mu);
  for (int i = 0; i < MAX_PARTS && s->parts[i]; i++) {
    if (i) sleep_ms(s->pause_ms);
    size_t len = s->part_len[i] ? s->part_len[i] : strlen(s->parts[i]);
    if (send(c, s->parts[i], len, MSG_NOSIGNAL) < 0) break;
  }
  if (s->hold_ms) sleep_ms(s->hold_ms);
}

static void *serve(void *arg) {
  server *s = arg;
  for (;;) {
    int c = accept(s->fd, NULL, NULL);
    if (c < 0) return NULL; /* shutdown() by server_stop */
    answer(s, c);
    close(c);
  }
}

static int listen_on_loopback(int backlog, int *port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int fd = mz_os_socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(fd, backlog), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  *port = ntohs(a.sin_port);
  return fd;
}

static server *server_start(const char *first, ...) {
  server *s = calloc(1, sizeof *s);
  va_list ap;
  assert_non_null(s);
  s->parts[0] = first;
  va_start(ap, first);
  for (int i = 1; i < MAX_PARTS && (s->parts[i] = va_arg(ap, const char *)); i++) {}
  va_end(ap);
  pthread_mutex_init(&s->mu, NULL);
  s->fd = listen_on_loopback(16, &s->port);
  assert_int_equal(pthread_create(&s->th, NULL, serve, s), 0);
  return s;
}

static void server_stop(server *s) {
  shutdown(s->fd, SHUT_RDWR);
  pthread_join(s->th, NULL);
  close(s->fd);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* ---- running a request ----------------------------------------------- */

typedef struct result {
  char text[4096], think[256];
  size_t text_len, think_len;
  int nevents, last;
  char code[32], message[512], headers[2048];
  long status;
  size_t body_len;
  double retry_after;
  cJSON *json; /* the terminal event's, duplicated */
} result;

static void copy_event(result *r, const mz_event *e) {
  r->nevents++;
  r->last = e->type;
  if (e->type == MZ_EV_TEXT && r->text_len + e->len < sizeof r->text)
    memcpy(r->text + r->text_len, e->text, e->len), r->text_len += e->len;
  if (e->type == MZ_EV_THINK && r->think_len + e->len < sizeof r->think)
    memcpy(r->think + r->think_len, e->text, e->len), r->think_len += e->len;
  if (e->type != MZ_EV_DONE && e->type != MZ_EV_ERROR && e->type != MZ_EV_RESPONSE) return;
  snprintf(r->code, sizeof r->code, "%s", e->code ? e->code : "");
  snprintf(r->message, sizeof r->message, "%.*s", (int)e->len, e->text);
  snprintf(r->headers, sizeof r->headers, "%.*s", (int)e->headers_len, e->headers ? e->headers : "");
  r->status = e->status;
  r->body_len = e->body_len;
  r->retry_after = e->retry_after;
  r->json = e->json ? cJSON_Duplicate(e->json, 1) : NULL;
}

/* Pull every event of one request (at most 20 s). */
static void run(const mz_request *req, result *r) {
  char err[128];
  const mz_event *e;
  mz_client *c = mz_client_new(NULL);
  mz_stream *s = mz_stream_open(c, req, err, sizeof err);
  double t0 = mz_now();
  memset(r, 0, sizeof *r);
  assert_non_null(s);
  while (mz_now() - t0 < 20) {
    int rc = mz_stream_next(s, 1000, &e);
    if (rc == MZ_NEXT_END) break;
    if (rc == MZ_NEXT_EVENT) copy_event(r, e);
  }
  assert_int_equal(r->last == MZ_EV_DONE || r->last == MZ_EV_ERROR || r->last == MZ_EV_RESPONSE, 1);
  mz_stream_close(s);
  mz_client_free(c);
}

static void result_free(result *r) {
  cJSON_Delete(r->json);
  r->json = NULL;
}

static char *url_of(const server *s, char *buf, size_t n) {
  snprintf(buf, n, "http://127.0.0.1:%d/v1/chat/completions", s->port);
  return buf;
}

static mz_request chat(const char *url) {
  mz_request r = {.url = url, .body = "{\"stream\":true}", .body_len = 15};
  return r;
}

static double num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  assert_true(cJSON_IsNumber(v));
  return v->valuedouble;
}

#define SSE_HEAD "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
#define TOKEN(t) "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" t "\"},\"finish_reason\":null}]}\n\n"
#define FINISH                                                                                                         \
  "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],"                                        \
  "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n"

/* ---- streams ---------------------------------------------------------- */

static void test_sse_stream(void **state) {
  char url[128];
  result r;
  (void)state;
  server *s = server_start(SSE_HEAD TOKEN("Hel") TOKEN("lo") FINISH "data: [DONE]\n\n", NULL);
  mz_request req = chat(url_of(s, url, sizeof url));
  run(&req, &r);
  assert_int_equal(r.last, MZ_EV_DONE);
  assert_int_equal(r.text_len, 5);
  assert_memory_equal(r.text, "Hello", 5);
  assert_string_equal(cJSON_GetObjectItem(r.json, "finish_reason")->valuestring, "stop");
  assert_int_equal((int)num(cJSON_GetObjectItem(r.json, "usage"), "completion_tokens"), 2);
  assert_null(cJSON_GetObjectItem(r.json, "no_done_marker"));
  /* what the server saw: POST, JSON body, SSE accepted, no api key */
  assert_true(strncmp(s->req, "POST /v1/chat/completions HTTP/1.1\r\n", 36) == 0);
  assert_non_null(strcasestr(s->req, "\r\nAccept: text/event-stream\r\n"));
  assert_non_null(strcasestr(s->req, "\r\nContent-Type: application/json\r\n"));
  assert_null(strcasestr(s->req, "Authorization"));
  assert_string_equal(s->req + s->req_len - 15, "{\"stream\":true}");
  result_free(&r);
  server_stop(s);
}

/* A server ignoring "stream": a chat.completion JSON body. */
static void test_json_body_fallback(void **state) {
  char url[128];
  result r;
  (void)state;
  static const char body[] = "{\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
                             "\"assistant\",\"content\":\"Hi there\"},\"finish_reason\":\"length\"}],\"usage\":"
                             "{\"total_tokens\":9}}";
  char head[128];
  snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
           sizeof body - 1);
  server *s = server_start(head, body, NULL);
  mz_request req = chat(url_of(s, url, sizeof url));
  run(&req, &r);
  assert_int_equal(r.last, MZ_EV_DONE);
  assert_int_equal(r.text_len, 8);
  assert_memory_equal(r.text, "Hi there", 8);
  assert_string_equal(cJSON_GetObjectItem(r.json, "finish_reason")->valuestring, "length");
  assert_int_equal((int)num(cJSON_GetObjectItem(r.json, "usage"), "total_tokens"), 9);
  result_free(&r);
  server_stop(s);
}

static void test_event_error_frame(void **state) {
  char url[128];
  result r;
  (void)state;
  server *s =
      server_start(SSE_HEAD TOKEN("a") "event: error\ndata: {\"error\":{\"message\":\"boom\",\"code\":500}}\n\n", NULL);
  mz_request req = chat(url_of(s, url, sizeof url));
  run(&req, &r);
  assert_int_equal(r.last, MZ_EV_ERROR);
  assert_string_equal(r.code, "server");
  assert_string_equal(r.message, "server error: boom");
  assert_int_equal(r.text_len, 1);
  assert_int_equal((int)num(r.json, "code"), 500);
  result_free(&r);
  /* event: error with a non-JSON payload */
  server_stop(s);
  s = server_start(SSE_HEAD "event: error\ndata: overloaded\n\n", NULL);
  req = chat(url_of(s, url, sizeof url));
  run(&req, &r);
  assert_string_equal(r.code, "server");
  assert_string_equal(r.message, "server error: overloaded");
  result_free(&r);
  server_stop(s);
}

/* Issue 8: a clean end after a finish_reason is done, marked; a cut
 * before any finish_reason stays "closed". */
static void test_no_done_marker(void **state) {
  char url[128];
  result r;
  (void)state;
  server *s = server_start(SSE_HEAD TOKEN("a") FINISH, NULL);
  mz_request req = chat(url_of(s, url, sizeof url));
  run(&req, &r);
  assert_int_equal(r.last, MZ_EV_DONE);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r.json, "no_done_marker")));
  assert_string_equal(cJSON_GetObjectItem(r.json, "finish_reason")->valuestring, "stop");
  assert_int_equal((int)num(cJSON_GetObjectItem(r.json, "usage"), "prompt_tokens"), 3);
  result_free(&r);
  server_stop(s);
  s = server_start(SSE_HEAD TOKEN("a") TOKEN("b"), NULL);
  req = chat(url_of(s, url, sizeof url));
  run(&req, &r);
  assert_int_equal(r.last, MZ_EV_ERROR);
  assert_string_equal(r.code, "closed");
  assert_int_equal(r.text_len, 2);
  result_free(&r);
  server_stop(s);
}

/* Issue 8: invalid UTF-8 replaced (across frames too), a character cut by
 * the end replaced, NUL kept; all counted on done. */
static void test_text_repairs(void **state) {
  char url[128];
  result r;
  (void)state;
  server *s = server_start(SSE_HEAD TOKEN("a\xFF") TOKEN("\xE2\x82") TOKEN("x\\u0000y") TOKEN("\xF0\x9F") FINISH, NULL);
  mz_request req = chat(url_of(s, url, sizeof url));
  run(&req, &r);
  assert_int_equal(r.last, MZ_EV_DONE);
  static const char want[] = "a\xEF\xBF\xBD\xEF\xBF\xBDx\0y\xEF\xBF\xBD";
  assert_int_equal(r.text_len, sizeof want - 1);
  assert_memory_equal(r.text, want, sizeof want - 1);
  assert_int_equal((int)num(r.json, "invalid_utf8"), 3);
  result_free(&r);
  server_stop(s);
}

/* ---- limits and timeouts ---------------------------------------------- */

static void test_event_cap(void **state) {
  char url[128], big[512];
  result r;
  (void)state;
  snprintf(big, sizeof big, "%s%s", SSE_HEAD TOKEN("kept"), "data: {\"choices\":[{\"delta\":{\"content\":\"");
  size_t at = strlen(big);
  assert_true(at + 300 < sizeof big);
  memset(big + at, 'x', 300); /* a frame that never ends, past the cap */
  big[at + 300] = '\0';
  server *s = server_start(big, NULL);
  mz_request req = chat(url_of(s, url, sizeof url));
  req.max_event_bytes = 200;
  run(&req, &r);
  assert_string_equal(r.code, "protocol");
  assert_non_null(strstr(r.message, "limit 200 bytes"));
  assert_int_equal(r.text_len, 4);
  result_free(&r);
  server_stop(s);
}

/* An error body over 64 KiB: the first 64 KiB kept, the message short. */
static void test_error_body_cap(void **state) {
  char url[128], head[128];
  size_t n = 100000;
  result r;
  (void)state;
  char *body = malloc(n + 1);
  assert_non_null(body);
  memset(body, 'e', n);
  body[n] = '\0';
  snprintf(head, sizeof head, "HTTP/1.1 500 Oops\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n\r\n", n);
  server *s = server_start(head, body, NULL);
  mz_request req = chat(url_of(s, url, sizeof url));
  run(&req, &r);
  assert_string_equal(r.code, "http");
  assert_int_equal(r.status, 500);
  assert_int_equal(r.body_len, 65536);
  char want[256];
  snprintf(want, sizeof want, "%s: HTTP 500 Internal Server Error: eee", url);
  assert_true(strncmp(r.message, want, strlen(want)) == 0);
  assert_string_equal(r.message + strlen(r.message) - 3, "...");
  assert_true(strlen(r.message) < 300);
  result_free(&r);
  server_stop(s);
  free(body);
}

static void test_deadline(void **state) {
  char url[128];
  result r;
  (void)state;
  server *s = server_start(SSE_HEAD TOKEN("a"), NULL);
  s->hold_ms = 3000;
  mz_request req = chat(url_of(s, url, sizeof url));
  req.deadline_ms = 300;
  double t0 = mz_now();
  run(&req, &r);
  assert_string_equal(r.code, "timeout");
  assert_non_null(strstr(r.message, "(deadline: the whole request took longer than the `deadline` option"));
  assert_int_equal(r.text_len, 1);
  assert_true(mz_now() - t0 < 2.5);
  result_free(&r);
  server_stop(s);
}

/* A listening socket whose accept queue is full: the SYN goes unanswered
 * and the connect times out (loopback only). */
static void test_connect_timeout(void **state) {
  char url[128];
  int port, fd = listen_on_loopback(0, &port), fill[4];
  struct sockaddr_in a = {
      .sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  result r;
  (void)state;
  for (int i = 0; i < 4; i++) {
    fill[i] = socket(AF_INET, SOCK_STREAM, 0);
    fcntl(fill[i], F_SETFL, fcntl(fill[i], F_GETFL) | O_NONBLOCK);
    connect(fill[i], (struct sockaddr *)&a, sizeof a);
  }
  snprintf(url, sizeof url, "http://127.0.0.1:%d/", port);
  mz_request req = {.url = url, .connect_timeout_ms = 300, .deadline_ms = 5000};
  double t0 = mz_now();
  run(&req, &r);
  assert_string_equal(r.code, "timeout");
  assert_non_null(strstr(r.message, "(connect timeout: no TCP connection in time; raise the `timeout` option"));
  assert_true(mz_now() - t0 < 5);
  result_free(&r);
  for (int i = 0; i < 4; i++) close(fill[i]);
  close(fd);
}

/* Issue 8: no head yet is no stall (a queued request); header_timeout is
 * the limit for that wait; a slow head resets the stall timer. */
static void test_head_waits(void **state) {
  char url[128];
  result r;
  (void)state;
  server *s = server_start("", SSE_HEAD TOKEN("q") FINISH "data: [DONE]\n\n", NULL);
  s->pause_ms = 700;
  mz_request req = chat(url_of(s, url, sizeof url));
  req.stall_timeout_ms = 250;
  run(&req, &r);
  assert_int_equal(r.last, MZ_EV_DONE);
  result_free(&r);
  req.header_timeout_ms = 200;
  req.stall_timeout_ms = 5000;
  double t0 = mz_now();
  run(&req, &r);
  assert_string_equal(r.code, "timeout");
  assert_non_null(strstr(r.message, "header timeout"));
  assert_true(mz_now() - t0 < 0.65);
  result_free(&r);
  server_stop(s);
  s = server_start("HTTP/1.1 200 OK\r\n", "Content-Type: text/event-stream\r\n", "X-A: 1\r\n", "X-B: 2\r\n",
                   "Connection: close\r\n\r\n", TOKEN("h") FINISH "data: [DONE]\n\n", NULL);
  s->pause_ms = 150;
  req = chat(url_of(s, url, sizeof url));
  req.stall_timeout_ms = 400;
  run(&req, &r);
  assert_int_equal(r.last, MZ_EV_DONE);
  assert_int_equal(r.text_len, 1);
  result_free(&r);
  server_stop(s);
}

static void test_stall(void **state) {
  char url[128];
  result r;
  (void)state;
  server *s = server_start(SSE_HEAD TOKEN("a"), NULL);
  s->hold_ms = 3000;
  mz_request req = chat(url_of(s, url, sizeof url));
  req.stall_timeout_ms = 300;
  run(&req, &r);
  assert_string_equal(r.code, "timeout");
  assert_non_null(strstr(r.message, "stall timeout"));
  assert_int_equal(r.text_len, 1);
  result_free(&r);
  server_stop(s);
}

/* Messages show URLs redacted (userinfo, credential-like parameters); the
 * clear-text warning's decision (no DNS: the text alone). */
static void test_redact_and_remote(void **state) {
  static const char *const cases[][2] = {
      {"http://u:p@h:1/x?api_key=S&a=1&Token=T#f", "http://[redacted]@h:1/x?api_key=[redacted]&a=1&Token=[redacted]#f"},
      {"user:pw@host/p?session=1", "[redacted]@host/p?session=1"},
      {"http://h/a@b?q", "http://h/a@b?q"},
      {"https://a@b@c/?x&passwd=&k", "https://[redacted]@c/?x&passwd=[redacted]&k"},
  };
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *r = mz_redact_url(cases[i][0]);
    assert_string_equal(r, cases[i][1]);
    free(r);
  }
  assert_true(mz_url_plain_remote("http://10.1.2.3:8080/v1"));
  assert_true(mz_url_plain_remote("box:8766/v1"));
  assert_true(mz_url_plain_remote("http://[2001:db8::1]/"));
  assert_false(mz_url_plain_remote("https://example.com/"));
  assert_false(mz_url_plain_remote("http://127.0.0.2:1/"));
  assert_false(mz_url_plain_remote("http://[::1]:8080/"));
  assert_false(mz_url_plain_remote("http://x:y@localhost/"));
  assert_false(mz_url_plain_remote("http://gpu.localhost:8080/v1"));
  assert_false(mz_url_plain_remote("http://a.b.LOCALHOST./v1"));
  assert_true(mz_url_plain_remote("http://notlocalhost/v1"));
  assert_true(mz_url_plain_remote("http://.localhost.example/v1"));
}

/* ---- what the server sees ---------------------------------------------- */

static void test_request_shape(void **state) {
  char url[128];
  result r;
  (void)state;
  server *s = server_start("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", NULL);
  const char *const headers[] = {"X-Test: yes", "Accept: application/x-ndjson", NULL};
  mz_request req = {.url = url_of(s, url, sizeof url),
                    .method = "PUT",
                    .body = "abc",
                    .body_len = 3,
                    .headers = headers,
                    .api_key = "sk-secret",
                    .plain = 1};
  run(&req, &r);
  assert_int_equal(r.last, MZ_EV_RESPONSE);
  assert_int_equal(r.status, 200);
  assert_int_equal(r.body_len, 2);
  assert_true(strncmp(s->req, "PUT /v1/chat/completions HTTP/1.1\r\n", 35) == 0);
  assert_non_null(strstr(s->req, "\r\nX-Test: yes\r\n"));
  assert_non_null(strstr(s->req, "\r\nAuthorization: Bearer sk-secret\r\n"));
  assert_non_null(strstr(s->req, "\r\nAccept: application/x-ndjson\r\n"));
  assert_null(strstr(s->req, "text/event-stream"));
  assert_non_null(strcasestr(s->req, "\r\nAccept-Encoding: ")); /* issue 8: decoded by libcurl */
  assert_string_equal(s->req + s->req_len - 3, "abc");
  assert_non_null(strstr(r.headers, "content-type: application/json\n"));
  result_free(&r);
  /* no body: GET */
  req = (mz_request){.url = url, .plain = 1};
  run(&req, &r);
  assert_true(strncmp(s->req, "GET /v1/chat/completions HTTP/1.1\r\n", 35) == 0);
  result_free(&r);
  server_stop(s);
}

/* ---- HTTP errors (issue 8) --------------------------------------------- */

static void test_http_error_details(void **state) {
  char url[128];
  result r;
  (void)state;
  server *s = server_start(
      "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nRetry-After: 12\r\n"
      "X-Custom: A\r\nx-custom: B\r\nContent-Length: 99\r\n\r\n"
      "{\"error\":{\"code\":400,\"message\":\"too long\",\"type\":\"exceed_context_size_error\",\"n_ctx\":256}}\n"
      "       ",
      NULL);
  mz_request req = chat(url_of(s, url, sizeof url));
  run(&req, &r);
  assert_string_equal(r.code, "http");
  char want[256];
  snprintf(want, sizeof want, "%s: HTTP 400 Bad Request: too long", url);
  assert_string_equal(r.message, want);
  assert_true(r.retry_after == 12);
  assert_int_equal((int)num(r.json, "n_ctx"), 256);
  assert_non_null(strstr(r.headers, "retry-after: 12\n"));
  assert_non_null(strstr(r.headers, "x-custom: A\nx-custom: B\n"));
  result_free(&r);
  server_stop(s);
  /* the HTTP-date form, an HTML page */
  char page[512];
  time_t t = time(NULL) + 100;
  struct tm tm;
  gmtime_r(&t, &tm);
  size_t n = strftime(page, sizeof page,
                      "HTTP/1.1 503 Service Unavailable\r\nRetry-After: %a, %d %b %Y %H:%M:%S GMT\r\n"
                      "Content-Type: text/html\r\nConnection: close\r\n\r\n",
                      &tm);
  snprintf(page + n, sizeof page - n, "<html><head><title>Down for maintenance</title></head></html>");
  s = server_start(page, NULL);
  req = chat(url_of(s, url, sizeof url));
  run(&req, &r);
  snprintf(want, sizeof want, "%s: HTTP 503 Service Unavailable: Down for maintenance", url);
  assert_string_equal(r.message, want);
  assert_true(r.retry_after >= 95 && r.retry_after <= 101);
  assert_null(r.json);
  result_free(&r);
  server_stop(s);
}

static void test_redirect_not_followed(void **state) {
  char url[128], want[256];
  result r;
  (void)state;
  server *s =
      server_start("HTTP/1.1 308 Permanent Redirect\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n", NULL);
  mz_request req = chat(url_of(s, url, sizeof url));
  run(&req, &r);
  snprintf(want, sizeof want,
           "%s: HTTP 308 Permanent Redirect to http://127.0.0.1:%d/elsewhere (redirects are not "
           "followed: use that url)",
           url, s->port);
  assert_string_equal(r.code, "http");
  assert_int_equal(r.status, 308);
  assert_string_equal(r.message, want);
  assert_int_equal(s->nreq, 1);
  result_free(&r);
  server_stop(s);
}

/* An HTTP error names the url requested, without its credentials. */
static void test_http_error_names_url(void **state) {
  char url[192], want[256];
  result r;
  (void)state;
  server *s = server_start("HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\n"
                           "Not Found\n",
                           NULL);
  snprintf(url, sizeof url, "http://me:secret@127.0.0.1:%d/v1/chat/completions/chat/completions?key=k1", s->port);
  mz_request req = chat(url);
  run(&req, &r);
  snprintf(want, sizeof want,
           "http://[redacted]@127.0.0.1:%d/v1/chat/completions/chat/completions?key=[redacted]: HTTP 404 Not "
           "Found: Not Found",
           s->port);
  assert_string_equal(r.code, "http");
  assert_int_equal(r.status, 404);
  assert_string_equal(r.message, want);
  result_free(&r);
  server_stop(s);
}

/* ---- a 2xx that is not the answer asked for (issue 31 item 7) ----------- */

#define ADVICE                                                                                                         \
  "check that the url is the daemon's API (a base url ending in /v1) and that no web UI or proxy answers in its "      \
  "place"
#define LOGIN_PAGE                                                                                                     \
  "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nConnection: close\r\n\r\n"                             \
  "<!DOCTYPE html>\n<html><head><title>Sign in &amp; go - "                                                            \
  "Proxy</title></head>\n<body><form>...</form></body></html>\n"

/* A web page where a stream was asked: a "protocol" error (not retried as
 * a cut), status 200, naming the url, the content type and the title. */
static void test_page_not_a_stream(void **state) {
  char url[128], want[512];
  result r;
  (void)state;
  server *s = server_start(LOGIN_PAGE, NULL);
  mz_request req = chat(url_of(s, url, sizeof url));
  run(&req, &r);
  snprintf(want, sizeof want, "%s answered 200 with text/html (\"Sign in & go - Proxy\"), not an event stream: " ADVICE,
           url);
  assert_int_equal(r.last, MZ_EV_ERROR);
  assert_int_equal(r.nevents, 1);
  assert_string_equal(r.code, "protocol");
  assert_int_equal(r.status, 200);
  assert_string_equal(r.message, want);
  assert_true(r.body_len > 0); /* the page is kept */
  result_free(&r);
  server_stop(s);
  /* a plain request: the same page is no JSON */
  s = server_start(LOGIN_PAGE, NULL);
  req = chat(url_of(s, url, sizeof url));
  req.plain = 1;
  run(&req, &r);
  snprintf(want, sizeof want, "%s answered 200 with text/html (\"Sign in & go - Proxy\"), not JSON: " ADVICE, url);
  assert_string_equal(r.code, "protocol");
  assert_string_equal(r.message, want);
  result_free(&r);
  server_stop(s);
}

/* Any other type than an event stream or JSON, for a stream; a page
 * without a title or text; a plain request's text stays an answer; an
 * answer without a Content-Type is still read as a stream. */
static void test_other_types_not_a_stream(void **state) {
  char url[128], want[512];
  result r;
  (void)state;
  server *s =
      server_start("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n", NULL);
  mz_request req = chat(url_of(s, url, sizeof url));
  run(&req, &r);
  snprintf(want, sizeof want, "%s answered 200 with application/octet-stream, not an event stream: " ADVICE, url);
  assert_string_equal(r.code, "protocol");
  assert_string_equal(r.message, want);
  result_free(&r);
  server_stop(s);
  static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nOK\n";
  s = server_start(ok, NULL);
  req = chat(url_of(s, url, sizeof url));
  req.plain = 1;
  run(&req, &r);
  assert_int_equal(r.last, MZ_EV_RESPONSE);
  assert_string_equal(r.message, "OK\n");
  result_free(&r);
  server_stop(s);
  s = server_start("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" TOKEN("hi") FINISH "data: [DONE]\n\n", NULL);
  req = chat(url_of(s, url, sizeof url));
  run(&req, &r);
  assert_int_equal(r.last, MZ_EV_DONE);
  assert_memory_equal(r.text, "hi", 2);
  result_free(&r);
  server_stop(s);
}

/* A 2xx of another type that does not end: the error comes once 64 KiB
 * of it are in, not at the end of the transfer. */
static void test_endless_page_ends_early(void **state) {
  char url[128];
  result r;
  (void)state;
  char *junk = malloc(70001);
  assert_non_null(junk);
  memset(junk, 'x', 70000);
  junk[70000] = '\0';
  server *s = server_start("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n", junk, NULL);
  s->hold_ms = 3000;
  mz_request req = chat(url_of(s, url, sizeof url));
  double t0 = mz_now();
  run(&req, &r);
  assert_true(mz_now() - t0 < 2);
  assert_string_equal(r.code, "protocol");
  assert_non_null(strstr(r.message, " answered 200 with text/plain (\"xxx"));
  assert_non_null(strstr(r.message, "...\"), not an event stream: "));
  result_free(&r);
  server_stop(s);
  free(junk);
}

/* ---- pending and finished --------------------------------------------- */

static void test_pending_finished(void **state) {
  char url[128], err[128];
  const mz_event *e;
  (void)state;
  server *s = server_start(SSE_HEAD TOKEN("a") TOKEN("b") TOKEN("c") FINISH "data: [DONE]\n\n", NULL);
  mz_client *c = mz_client_new(NULL);
  mz_request req = chat(url_of(s, url, sizeof url));
  mz_stream *st = mz_stream_open(c, &req, err, sizeof err);
  assert_non_null(st);
  assert_int_equal(mz_client_streams(c), 1);
  assert_int_equal(mz_stream_finished(st), 0);
  assert_int_equal(mz_stream_pending(st), 0);
  double t0 = mz_now();
  while (!mz_stream_finished(st) && mz_now() - t0 < 10) mz_client_sleep(c, 20);
  assert_int_equal(mz_stream_finished(st), 1);
  assert_int_equal(mz_stream_pending(st), 4); /* three texts and done */
  assert_int_equal(mz_stream_next(st, 0, &e), MZ_NEXT_EVENT);
  assert_int_equal(mz_stream_pending(st), 3);
  assert_int_equal(mz_client_wait(c, 0), 1);
  while (mz_stream_next(st, 0, &e) == MZ_NEXT_EVENT) {}
  assert_int_equal(mz_stream_pending(st), 0);
  assert_int_equal(mz_stream_next(st, 0, &e), MZ_NEXT_END);
  mz_stream_close(st);
  assert_int_equal(mz_client_streams(c), 0);
  mz_client_free(c);
  server_stop(s);
}

#define THINK(t) "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"" t "\"}}]}\n\n"
#define TOKEN1(t) "data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"" t "\"}}]}\n\n"

/* One pop of a merge stream: its type, choice, text and deltas. */
static void expect_merged(mz_stream *st, mz_evtype type, int index, const char *text, size_t deltas) {
  const mz_event *e;
  assert_int_equal(mz_stream_next(st, 0, &e), MZ_NEXT_EVENT);
  assert_int_equal(e->type, type);
  assert_int_equal(e->index, index);
  assert_int_equal(e->len, strlen(text));
  assert_memory_equal(e->text, text, e->len);
  assert_int_equal(e->deltas, deltas);
}

/* merge: the deltas queued back to back of one channel and choice come as
 * one event; a change of channel or choice, or any other event, ends the
 * run; a character split between two deltas is whole in the joined text. */
static void test_merge(void **state) {
  char url[128], err[128];
  const mz_event *e;
  (void)state;
  server *s = server_start(
      SSE_HEAD THINK("Let ") THINK("me ") TOKEN("Hel") TOKEN("lo") TOKEN1("x") TOKEN(" caf\xC3") TOKEN("\xA9")
          TOKEN("!") "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[]}}]}\n\n" TOKEN("a") FINISH
      "data: [DONE]\n\n",
      NULL);
  mz_client *c = mz_client_new(NULL);
  mz_request req = chat(url_of(s, url, sizeof url));
  req.merge = 1;
  mz_stream *st = mz_stream_open(c, &req, err, sizeof err);
  assert_non_null(st);
  double t0 = mz_now();
  while (!mz_stream_finished(st) && mz_now() - t0 < 10) mz_client_sleep(c, 20);
  assert_int_equal(mz_stream_pending(st), 11); /* 2 think, 7 text, 1 tool call, done */
  expect_merged(st, MZ_EV_THINK, 0, "Let me ", 2);
  expect_merged(st, MZ_EV_TEXT, 0, "Hello", 2);
  expect_merged(st, MZ_EV_TEXT, 1, "x", 1);
  expect_merged(st, MZ_EV_TEXT, 0, " caf\xC3\xA9!", 3);
  assert_int_equal(mz_stream_next(st, 0, &e), MZ_NEXT_EVENT);
  assert_int_equal(e->type, MZ_EV_TOOL_CALL);
  expect_merged(st, MZ_EV_TEXT, 0, "a", 1);
  assert_int_equal(mz_stream_next(st, 0, &e), MZ_NEXT_EVENT);
  assert_int_equal(e->type, MZ_EV_DONE);
  assert_int_equal(mz_stream_next(st, 0, &e), MZ_NEXT_END);
  mz_stream_close(st);
  mz_client_free(c);
  server_stop(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sse_stream),
      cmocka_unit_test(test_json_body_fallback),
      cmocka_unit_test(test_event_error_frame),
      cmocka_unit_test(test_no_done_marker),
      cmocka_unit_test(test_text_repairs),
      cmocka_unit_test(test_event_cap),
      cmocka_unit_test(test_error_body_cap),
      cmocka_unit_test(test_deadline),
      cmocka_unit_test(test_connect_timeout),
      cmocka_unit_test(test_head_waits),
      cmocka_unit_test(test_stall),
      cmocka_unit_test(test_request_shape),
      cmocka_unit_test(test_http_error_details),
      cmocka_unit_test(test_redirect_not_followed),
      cmocka_unit_test(test_http_error_names_url),
      cmocka_unit_test(test_page_not_a_stream),
      cmocka_unit_test(test_other_types_not_a_stream),
      cmocka_unit_test(test_endless_page_ends_early),
      cmocka_unit_test(test_pending_finished),
      cmocka_unit_test(test_merge),
      cmocka_unit_test(test_redact_and_remote),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
