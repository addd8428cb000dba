/*
 * recorded.c - --replay-dir DIR: serve a directory recorded by mirza
 * (mirza.record: NNNNNN.request and NNNNNN.response pairs) again.
 *
 * A request is answered from the recordings of the same method and path:
 * the next one not yet served (--replay-match order, the default), or the
 * first one not yet served whose body is byte-identical (--replay-match
 * body). A method and path never recorded are served by the simulator as
 * usual; once its recordings are used up, a request gets a 500 that says
 * so. The body goes out byte for byte as recorded; the head keeps the
 * recorded status and headers except the framing ones (Content-Length,
 * Transfer-Encoding, Content-Encoding, Connection, Keep-Alive, Server,
 * Cache-Control), which the simulator sets itself. An event stream is sent
 * chunked, one SSE event per chunk.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sim.h"

typedef struct recording {
  char method[16], path[1024];
  char *body; /* the request body */
  size_t body_len;
  char *resp; /* the response file: head(s) then body */
  size_t resp_len;
  bool used;
} recording;

struct recorded_set {
  recording *r;
  size_t n;
  bool by_body;
};

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* "METHOD URL\n...headers...\n\nBODY": method, path (no scheme, host or
 * query), body. */
static int parse_request(recording *rec, char *text, size_t n) {
  char url[1024];
  if (sscanf(text, "%15s %1023s", rec->method, url) != 2) return -1;
  const char *p = strstr(url, "://");
  p = p ? strchr(p + 3, '/') : url;
  snprintf(rec->path, sizeof rec->path, "%s", p ? p : "/");
  rec->path[strcspn(rec->path, "?#")] = '\0';
  char *sep = strstr(text, "\n\n");
  size_t off = sep ? (size_t)(sep + 2 - text) : n;
  rec->body_len = n - off;
  rec->body = sim_strndup(text + off, rec->body_len);
  return 0;
}

/* DIR/NAME.request and its DIR/NAME.response. A path that does not fit,
 * the .response one included (a byte longer), is refused, never cut. */
static int load_one(recording *rec, const char *dir, const char *name) {
  char path[4096];
  size_t n, stem;
  int len = snprintf(path, sizeof path, "%s/%s", dir, name);
  if (len < 0 || (size_t)len + strlen(".response") - strlen(".request") >= sizeof path) return -1;
  stem = (size_t)len - strlen(".request"); /* name ends in .request (recorded_load) */
  char *text = sim_slurp(path, 0, &n);
  if (!text) return -1;
  int rc = parse_request(rec, text, n);
  free(text);
  memcpy(path + stem, ".response", sizeof ".response");
  if (rc || !(rec->resp = sim_slurp(path, 0, &rec->resp_len))) return -1;
  return 0;
}

int recorded_load(server *s, const char *dir, bool by_body) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  char **names = NULL;
  size_t n = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t l = strlen(de->d_name);
    if (l > 8 && strcmp(de->d_name + l - 8, ".request") == 0) {
      char **more = realloc(names, (n + 1) * sizeof *names);
      if (!more) abort();
      names = more;
      names[n++] = sim_strndup(de->d_name, l);
    }
  }
  closedir(d);
  if (n) qsort(names, n, sizeof *names, by_name); /* names is NULL when there are none */
  struct recorded_set *set = calloc(1, sizeof *set);
  if (!set || !(set->r = calloc(n ? n : 1, sizeof *set->r))) abort();
  set->by_body = by_body;
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    if (!rc && load_one(&set->r[set->n], dir, names[i]) == 0) set->n++;
    else rc = -1;
    free(names[i]);
  }
  free(names);
  s->recorded = set;
  return rc;
}

/* The recording for this request: NULL when none has its method and path
 * (*known = false), or when they are all used. */
static recording *pick(server *s, const http_request *r, bool *known) {
  struct recorded_set *set = s->recorded;
  recording *found = NULL;
  *known = false;
  pthread_mutex_lock(&s->mu);
  for (size_t i = 0; i < set->n && !found; i++) {
    recording *rec = &set->r[i];
    if (strcmp(rec->method, r->method) != 0 || strcmp(rec->path, r->path) != 0) continue;
    *known = true;
    bool same =
        !set->by_body || (rec->body_len == r->body_len && memcmp(rec->body, r->body ? r->body : "", r->body_len) == 0);
    if (!rec->used && same) found = rec;
  }
  if (found) found->used = true;
  pthread_mutex_unlock(&s->mu);
  return found;
}

static bool framing_header(const char *line, size_t n) {
  static const char *const skip[] = {
      "content-length:", "transfer-encoding:", "content-encoding:", "connection:", "keep-alive:",
      "server:",         "cache-control:",     "content-type:"};
  for (size_t i = 0; i < sizeof skip / sizeof *skip; i++)
    if (n >= strlen(skip[i]) && strncasecmp(line, skip[i], strlen(skip[i])) == 0) return true;
  return false;
}

/* Parse the last (final, non-1xx) head: status, content type, the other
 * headers as "Name: value\r\n" lines; returns the body offset. */
static size_t parse_head(const recording *rec, int *status, char *ctype, size_t clen, sbuf *extra) {
  const char *p = rec->resp, *end = p + rec->resp_len;
  for (;;) {
    *status = 200;
    sscanf(p, "HTTP/%*s %d", status);
    extra->len = 0;
    ctype[0] = '\0';
    const char *nl;
    while ((nl = memchr(p, '\n', (size_t)(end - p)))) {
      size_t n = (size_t)(nl - p);
      if (n && p[n - 1] == '\r') n--;
      const char *line = p;
      p = nl + 1;
      if (n == 0) break;
      if (strncasecmp(line, "content-type:", 13) == 0) {
        const char *v = line + 13;
        while (*v == ' ') v++;
        snprintf(ctype, clen, "%.*s", (int)(n - (size_t)(v - line)), v);
      } else if (!framing_header(line, n) && memchr(line, ':', n)) {
        sbuf_add(extra, line, n);
        sbuf_adds(extra, "\r\n");
      }
    }
    if (*status >= 200 || !nl || p >= end) return (size_t)(p - rec->resp);
  }
}

static int send_recording(conn *c, const recording *rec) {
  int status;
  char ctype[256];
  sbuf extra = {0};
  size_t off = parse_head(rec, &status, ctype, sizeof ctype, &extra);
  const char *body = rec->resp + off;
  size_t n = rec->resp_len - off;
  int rc;
  if (strstr(ctype, "event-stream")) {
    rc = http_begin_chunked(c, status, ctype, extra.p);
    for (size_t k = 0; !rc && k < n; k += sim_event_len(body + k, n - k))
      rc = http_chunk(c, body + k, sim_event_len(body + k, n - k));
    rc = rc || http_end_chunked(c);
  } else {
    rc = http_send(c, status, ctype[0] ? ctype : NULL, extra.p, body, n);
  }
  sbuf_free(&extra);
  if (rc) c->must_close = true;
  return status;
}

int recorded_route(conn *c, const http_request *r) {
  bool known;
  recording *rec = pick(c->srv, r, &known);
  if (rec) return send_recording(c, rec);
  if (!known) return -1;
  char msg[700];
  snprintf(msg, sizeof msg, "replay: no recorded response left for %s %s", r->method, r->path);
  return send_error(c, 500, msg, "server_error", "ReplayExhausted");
}
