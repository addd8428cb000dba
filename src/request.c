/*
 * request.c - a request made a stream (client.h's mz_stream_open and
 * mz_stream_close): its headers, the options of its libcurl easy handle,
 * the socket libcurl opens for it, the stream linked into the client and
 * its transfer added to the multi handle; closing undoes all of it. What
 * then happens to the transfer is client.c's (the driver), what its
 * response means is response.c's.
 *
 * Nothing here waits or runs a transfer: a stream opened is only due to
 * start at the next wait, when libcurl's timer says so.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "client_int.h"
#include "mirza.h"
#include "os.h"

/* The transfer out of the multi handle and freed: a running one closes its
 * connection (the daemon stops generating). Idempotent; the stream and its
 * queue stay until mz_stream_close. */
void mz_detach_easy(mz_stream *s) {
  if (!s->easy) return;
  mz_client *c = s->c;
  curl_multi_remove_handle(c->multi, s->easy);
  curl_easy_cleanup(s->easy);
  s->easy = NULL;
  c->nrunning--;
  if (s->sock >= 0 && (size_t)s->sock < c->nfd_rx && c->fd_owner[s->sock] == s) c->fd_owner[s->sock] = NULL;
}

/* libcurl's socket, opened here so that a failure keeps its errno: with
 * no descriptor left (EMFILE), libcurl 7.88 reports "Couldn't connect",
 * which would read as a daemon that is down (response.c says what it is). */
static curl_socket_t open_socket(void *ud, curlsocktype purpose, struct curl_sockaddr *a) {
  (void)purpose;
  mz_stream *s = ud;
  curl_socket_t fd = mz_os_socket(a->family, a->socktype, a->protocol); /* close-on-exec: a daemon the script
                                                                           starts does not inherit it */
  s->sock_errno = fd == CURL_SOCKET_BAD ? errno : 0;
  return fd;
}

/* ------------------------------------------------------ headers and options */

static int has_header(const char *const *h, const char *name) {
  size_t n = strlen(name);
  for (; h && *h; h++)
    if (strncasecmp(*h, name, n) == 0 && (*h)[n] == ':') return 1;
  return 0;
}

static int add_header(mz_stream *s, const char *h) {
  struct curl_slist *l = curl_slist_append(s->hdrs, h);
  if (!l) return -1;
  s->hdrs = l;
  return 0;
}

static int build_headers(mz_stream *s, const mz_request *r) {
  int rc = 0;
  if (r->body && !has_header(r->headers, "Content-Type")) rc |= add_header(s, "Content-Type: application/json");
  if (!has_header(r->headers, "Accept"))
    rc |= add_header(s, r->plain ? "Accept: application/json" : "Accept: text/event-stream");
  rc |= add_header(s, "Expect:"); /* no 100-continue round trip */
  for (const char *const *h = r->headers; h && *h; h++) rc |= add_header(s, *h);
  if (r->api_key && *r->api_key) {
    char auth[1024];
    if (snprintf(auth, sizeof auth, "Authorization: Bearer %s", r->api_key) >= (int)sizeof auth) return -1;
    rc |= add_header(s, auth);
    memset(auth, 0, sizeof auth);
  }
  return rc;
}

static int setup_easy(mz_stream *s, const mz_request *r) {
  CURL *e = s->easy;
  int rc = 0;
  rc |= curl_easy_setopt(e, CURLOPT_URL, r->url);
  rc |= curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)s);
  rc |= curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, mz_on_write);
  rc |= curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
  rc |= curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, mz_on_header);
  rc |= curl_easy_setopt(e, CURLOPT_HEADERDATA, s);
  rc |= curl_easy_setopt(e, CURLOPT_ERRORBUFFER, s->errbuf);
  rc |= curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, open_socket);
  rc |= curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, s);
  rc |= curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  rc |= curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  rc |= curl_easy_setopt(e, CURLOPT_USERAGENT, "mirza/" MIRZA_VERSION);
  rc |= curl_easy_setopt(e, CURLOPT_HTTPHEADER, s->hdrs);
  /* libcurl decodes any Content-Encoding it supports (gzip, deflate, ...),
   * also when the script sent its own Accept-Encoding header */
  rc |= curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, "");
  long cto = r->connect_timeout_ms > 0 ? r->connect_timeout_ms : r->connect_timeout_ms < 0 ? 0L : 10000L;
  rc |= curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, cto); /* 0: libcurl's own, 300 s */
  if (r->deadline_ms > 0) rc |= curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, r->deadline_ms);
  if (r->body) {
    rc |= curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body_len);
    rc |= curl_easy_setopt(e, CURLOPT_COPYPOSTFIELDS, r->body);
  } else if (r->method && strcmp(r->method, "POST") == 0) {
    rc |= curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, 0L);
    rc |= curl_easy_setopt(e, CURLOPT_COPYPOSTFIELDS, "");
  }
  if (r->method && strcmp(r->method, "GET") != 0 && strcmp(r->method, "POST") != 0)
    rc |= curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r->method);
  return rc;
}

/* ------------------------------------------------------ open / close */

mz_stream *mz_stream_open(mz_client *c, const mz_request *r, char *err, size_t errlen) {
  if (!r->url || !*r->url) {
    snprintf(err, errlen, "missing url");
    return NULL;
  }
  mz_stream *s = calloc(1, sizeof *s);
  if (!s || !(s->url = mz_redact_url(r->url)) || !(s->easy = curl_easy_init())) goto oom; /* for messages */
  s->c = c;
  s->plain = r->plain;
  s->sealed = strncasecmp(r->url, "https:", 6) == 0; /* due.c cannot look into its socket */
  s->skip_bad = r->skip_bad_frames;
  s->merge = r->merge;
  s->step = r->step;
  s->hold_s = r->plain ? 0 : (double)r->hold_ms / 1000.0; /* a plain answer is one event anyway */
  s->stall_s = (double)r->stall_timeout_ms / 1000.0;
  s->header_s = (double)r->header_timeout_ms / 1000.0;
  s->last_rx = s->t_open = mz_now();
  s->sock = CURL_SOCKET_BAD;
  s->connect_ms = r->connect_timeout_ms > 0 ? r->connect_timeout_ms : r->connect_timeout_ms < 0 ? 0 : 10000;
  s->deadline_ms = r->deadline_ms > 0 ? r->deadline_ms : 0;
  s->retry_after = -1;
  s->due_at = INFINITY;
  mz_sse_init(&s->sse, r->max_event_bytes, mz_on_sse_event, s);
  if (build_headers(s, r)) goto oom;
  if (setup_easy(s, r)) {
    snprintf(err, errlen, "invalid request options");
    goto fail;
  }
  if (r->record_path && !(s->rec = fopen(r->record_path, "wb"))) {
    snprintf(err, errlen, "cannot record into %s: %s", r->record_path, strerror(errno));
    goto fail;
  }
  if (mz_due_reserve(c, c->nstreams + 1) || curl_multi_add_handle(c->multi, s->easy) != CURLM_OK) goto oom;
  c->nrunning++;
  if (s->header_s > 0) mz_due_at(s, s->t_open + s->header_s);
  mz_conn_open(s);
  s->next = c->streams;
  if (c->streams) c->streams->prev = s;
  c->streams = s;
  c->nstreams++;
  return s;
oom:
  snprintf(err, errlen, "out of memory");
fail:
  if (s) {
    if (s->rec) fclose(s->rec);
    if (s->easy) curl_easy_cleanup(s->easy);
    curl_slist_free_all(s->hdrs);
    mz_sse_free(&s->sse);
    free(s->url);
    free(s);
  }
  return NULL;
}

void mz_stream_close(mz_stream *s) {
  if (!s) return;
  mz_client *c = s->c;
  mz_detach_easy(s);
  mz_unmark_ready(s);
  mz_due_drop(s);
  mz_conn_close(s);
  if (s->prev) s->prev->next = s->next;
  else c->streams = s->next;
  if (s->next) s->next->prev = s->prev;
  c->nstreams--;
  mz_queue_free(s);
  cJSON_Delete(s->usage);
  cJSON_Delete(s->timings);
  cJSON_Delete(s->stats);
  cJSON_Delete(s->extra);
  curl_slist_free_all(s->hdrs);
  mz_sse_free(&s->sse);
  mz_buf_free(&s->body);
  mz_buf_free(&s->headers);
  if (s->rec) fclose(s->rec);
  free(s->url);
  free(s);
}
