/*
 * http.c - the minimal HTTP/1.1 server side mirza-sim needs.
 *
 * One request at a time per connection, keep-alive by default (libcurl
 * reuses connections, and the client must be tested against that),
 * pipelined bytes kept for the next request. Request bodies must carry a
 * Content-Length (chunked uploads get 411); "Expect: 100-continue" is
 * answered so curl does not stall a second on large bodies. Responses are
 * either Content-Length or chunked; each chunk is written with one writev so
 * a batch of SSE frames costs one syscall.
 *
 * Disconnects are noticed while waiting (sys.h: sys_peer_gone), and by
 * write errors (SIGPIPE is ignored, MSG_NOSIGNAL used anyway) while sending.
 */
#define _GNU_SOURCE /* strcasestr (macOS: _DARWIN_C_SOURCE, from CMake) */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"
#include "sys.h"

const char *http_reason(int status) {
  switch (status) {
  case 100: return "Continue";
  case 200: return "OK";
  case 301: return "Moved Permanently";
  case 302: return "Found";
  case 303: return "See Other";
  case 307: return "Temporary Redirect";
  case 308: return "Permanent Redirect";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 409: return "Conflict";
  case 411: return "Length Required";
  case 413: return "Payload Too Large";
  case 422: return "Unprocessable Entity";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 502: return "Bad Gateway";
  case 503: return "Service Unavailable";
  case 504: return "Gateway Timeout";
  default: return status < 400 ? "OK" : status < 500 ? "Client Error" : "Server Error";
  }
}

const char *http_get_header(const http_request *r, const char *name) {
  for (int i = 0; i < r->nh; i++)
    if (strcasecmp(r->h[i].name, name) == 0) return r->h[i].value;
  return NULL;
}

/* Read more bytes into c->buf, waiting at most timeout_ms for the first.
 * Returns bytes read, 0 on EOF/timeout/error. */
static size_t fill(conn *c, int timeout_ms) {
  if (c->cap - c->len < 4096) {
    size_t cap = c->cap ? c->cap * 2 : 8192;
    char *p = realloc(c->buf, cap);
    if (!p) abort();
    c->buf = p;
    c->cap = cap;
  }
  struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
  int pr;
  do pr = poll(&pfd, 1, timeout_ms);
  while (pr < 0 && errno == EINTR);
  if (pr <= 0) return 0;
  ssize_t n;
  do n = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return 0;
  c->len += (size_t)n;
  return (size_t)n;
}

/* Find the end of the header block; accepts CRLF or bare LF line ends. */
static char *header_end(char *p, size_t n, size_t *hlen) {
  for (size_t i = 0; i + 1 < n; i++) {
    if (p[i] != '\n') continue;
    if (p[i + 1] == '\n') {
      *hlen = i + 2;
      return p + i;
    }
    if (p[i + 1] == '\r' && i + 2 < n && p[i + 2] == '\n') {
      *hlen = i + 3;
      return p + i;
    }
  }
  return NULL;
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  char *e = s + strlen(s);
  while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) *--e = '\0';
  return s;
}

/* Parse the request line and headers in place (NUL-terminating each). */
static int parse_head(http_request *r, char *p) {
  char *save = NULL;
  char *line = strtok_r(p, "\n", &save);
  if (!line) return 400;
  char *sp1 = strchr(line, ' '), *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
  if (!sp1 || !sp2) return 400;
  *sp1 = *sp2 = '\0';
  char *ver = trim(sp2 + 1);
  if (strncmp(ver, "HTTP/1.", 7) != 0 || !ver[7]) return strncmp(ver, "HTTP/", 5) == 0 ? 505 : 400;
  r->method = line;
  r->target = sp1 + 1;
  r->minor = ver[7] - '0';
  size_t pl = strcspn(r->target, "?#");
  if (pl >= sizeof r->path) return 414;
  memcpy(r->path, r->target, pl);
  r->path[pl] = '\0';
  r->nh = 0;
  while ((line = strtok_r(NULL, "\n", &save))) {
    char *colon = strchr(line, ':');
    if (!colon || colon == line) return 400;
    if (r->nh == SIM_MAX_HEADERS) return 431;
    *colon = '\0';
    r->h[r->nh].name = trim(line);
    r->h[r->nh].value = trim(colon + 1);
    r->nh++;
  }
  return 0;
}

static bool want_keep_alive(const http_request *r) {
  const char *cn = http_get_header(r, "Connection");
  if (cn && strcasestr(cn, "close")) return false;
  if (r->minor == 0) return cn && strcasestr(cn, "keep-alive");
  return true;
}

/* Drop the previous request's bytes, keeping any pipelined ones. */
static void discard_used(conn *c) {
  if (c->used) {
    memmove(c->buf, c->buf + c->used, c->len - c->used);
    c->len -= c->used;
    c->used = 0;
  }
}

static void rebase(const char **p, const char *from, const char *to) {
  if (*p) *p = to + (*p - from);
}

/* Make room for the whole body at once; the parsed strings point into the
 * buffer, so they move with it. fill() then never reallocates mid-body. */
static void reserve_body(conn *c, http_request *r, size_t need) {
  if (c->cap >= need) return;
  char *old = c->buf, *p = malloc(need);
  if (!p) abort();
  memcpy(p, old, c->len);
  rebase(&r->method, old, p);
  rebase(&r->target, old, p);
  for (int i = 0; i < r->nh; i++) {
    rebase(&r->h[i].name, old, p);
    rebase(&r->h[i].value, old, p);
  }
  free(old);
  c->buf = p;
  c->cap = need;
}

static int read_body(conn *c, http_request *r, size_t hlen) {
  const char *te = http_get_header(r, "Transfer-Encoding");
  if (te && strcasecmp(te, "identity") != 0) return 411;
  const char *cl = http_get_header(r, "Content-Length");
  char *end = NULL;
  unsigned long long blen = cl ? strtoull(cl, &end, 10) : 0;
  if (cl && (end == cl || *end || cl[0] == '-')) return 400;
  if (blen > SIM_MAX_BODY_BYTES) return 413;
  reserve_body(c, r, hlen + (size_t)blen + 8192);
  const char *ex = http_get_header(r, "Expect");
  if (ex && strcasecmp(ex, "100-continue") == 0 && c->len < hlen + blen) {
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (http_write_all(c, cont, sizeof cont - 1)) return -1;
  }
  while (c->len < hlen + blen)
    if (!fill(c, 30000)) return -1;
  r->body = c->buf + hlen;
  r->body_len = (size_t)blen;
  c->used = hlen + (size_t)blen;
  return 0;
}

/* Read one request. Returns 0 when r is ready, -1 when the connection ended
 * (EOF, idle keep-alive timeout, error), or an HTTP status to answer before
 * closing (400, 411, 413, 431, ...). Header strings point into c->buf and
 * stay valid until the next call; the body is not NUL-terminated. */
int http_read_request(conn *c, http_request *r) {
  discard_used(c);
  memset(r, 0, sizeof *r);
  size_t hlen = 0;
  char *he;
  int timeout = (int)c->srv->cfg.keepalive_ms;
  while (!(he = header_end(c->buf, c->len, &hlen))) {
    if (c->len > SIM_MAX_HEADER_BYTES) return 431;
    if (!fill(c, c->len ? 30000 : timeout)) return -1;
  }
  if (hlen > SIM_MAX_HEADER_BYTES) return 431;
  *he = '\0';
  int st = parse_head(r, c->buf);
  if (st) return st;
  r->keep_alive = want_keep_alive(r);
  return read_body(c, r, hlen);
}

int http_write_all(conn *c, const void *p, size_t n) {
  const char *s = p;
  while (n) {
    ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      c->must_close = true;
      return -1;
    }
    s += w;
    n -= (size_t)w;
  }
  return 0;
}

static int writev_all(conn *c, struct iovec *iov, int cnt) {
  while (cnt) {
    ssize_t w = writev(c->fd, iov, cnt);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      c->must_close = true;
      return -1;
    }
    while (cnt && (size_t)w >= iov->iov_len) {
      w -= (ssize_t)iov->iov_len;
      iov++, cnt--;
    }
    if (cnt) {
      iov->iov_base = (char *)iov->iov_base + w;
      iov->iov_len -= (size_t)w;
    }
  }
  return 0;
}

static void status_head(conn *c, sbuf *h, int status, const char *ctype, const char *extra) {
  sbuf_printf(h, "HTTP/1.1 %d %s\r\nServer: mirza-sim\r\n", status, http_reason(status));
  if (ctype) sbuf_printf(h, "Content-Type: %s\r\n", ctype);
  if (extra) sbuf_adds(h, extra);
  sbuf_adds(h, c->must_close ? "Connection: close\r\n" : "Keep-Alive: timeout=5, max=100\r\n");
}

/* ---- response faults: slow head, gzip ----------------------------------- */

void http_faults(conn *c, const sim_faults *f) {
  c->slow_head_ms = f ? f->slow_head_ms : 0;
  c->head_bytes_ms = f ? f->head_bytes_ms : 0;
  c->gzip = f && f->gzip;
  c->coalesce = false;
  c->wire.len = 0;
  c->gz_crc = 0;
  c->gz_size = 0;
}

/* The head, at once or (slow-head fault) one line at a time with a pause
 * before each, or (slow-head-bytes) one byte at a time: a client must not
 * take a slow head for a stall. */
static int write_head(conn *c, const sbuf *h) {
  if (c->slow_head_ms <= 0 && c->head_bytes_ms <= 0) return http_write_all(c, h->p, h->len);
  long ms = c->head_bytes_ms > 0 ? c->head_bytes_ms : c->slow_head_ms;
  for (size_t off = 0; off < h->len;) {
    const char *nl = memchr(h->p + off, '\n', h->len - off);
    size_t n = nl ? (size_t)(nl - h->p) + 1 - off : h->len - off;
    if (c->head_bytes_ms > 0) n = 1;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR)
      ;
    if (http_write_all(c, h->p + off, n)) return -1;
    off += n;
  }
  return 0;
}

/* Bitwise CRC-32 (gzip's): no table, no shared state between threads. */
static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
  crc = ~crc;
  while (n--) {
    crc ^= *p++;
    for (int k = 0; k < 8; k++) crc = crc >> 1 ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

/* Append p[0..n) to out as gzip: the 10-byte header first (first), the
 * bytes as stored (uncompressed) deflate blocks, and with last an empty
 * final block and the CRC/size trailer. Valid gzip any decoder reads; the
 * point is the Content-Encoding, not the ratio. */
static void gz_wrap(conn *c, sbuf *out, const char *p, size_t n, bool first, bool last) {
  static const unsigned char head[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
  if (first) sbuf_add(out, head, sizeof head);
  c->gz_crc = crc32_update(c->gz_crc, (const unsigned char *)p, n);
  c->gz_size += (uint32_t)n;
  for (size_t off = 0; off < n || (last && off == n);) {
    size_t k = n - off > 65535 ? 65535 : n - off;
    bool fin = last && off + k == n;
    unsigned char b[5] = {fin, (unsigned char)k, (unsigned char)(k >> 8), (unsigned char)~k, (unsigned char)(~k >> 8)};
    sbuf_add(out, b, 5);
    sbuf_add(out, p + off, k);
    off += k;
    if (fin) break;
  }
  if (last) {
    unsigned char t[8];
    for (int i = 0; i < 4; i++) {
      t[i] = (unsigned char)(c->gz_crc >> (8 * i));
      t[4 + i] = (unsigned char)(c->gz_size >> (8 * i));
    }
    sbuf_add(out, t, 8);
  }
}

/* A complete response with Content-Length. Set c->must_close before the
 * call to answer with "Connection: close". */
int http_send(conn *c, int status, const char *ctype, const char *extra, const char *body, size_t n) {
  sbuf h = {0}, z = {0};
  status_head(c, &h, status, ctype, extra);
  if (c->gzip) {
    gz_wrap(c, &z, body, n, true, true);
    body = z.p, n = z.len;
    sbuf_adds(&h, "Content-Encoding: gzip\r\n");
  }
  sbuf_printf(&h, "Content-Length: %zu\r\n\r\n", n);
  int rc = write_head(c, &h);
  if (!rc && n) rc = http_write_all(c, body, n);
  sbuf_free(&h);
  sbuf_free(&z);
  return rc;
}

int http_begin_chunked(conn *c, int status, const char *ctype, const char *extra) {
  sbuf h = {0};
  status_head(c, &h, status, ctype, extra);
  if (c->gzip) sbuf_adds(&h, "Content-Encoding: gzip\r\n");
  sbuf_adds(&h, "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n");
  int rc = write_head(c, &h);
  sbuf_free(&h);
  return rc;
}

/* Write what --coalesce-writes gathered (before a wait, a cut, a crash
 * and at the end). */
int http_flush(conn *c) {
  if (!c->wire.len) return 0;
  int rc = http_write_all(c, c->wire.p, c->wire.len);
  c->wire.len = 0;
  return rc;
}

static int raw_chunk(conn *c, const char *p, size_t n) {
  char size[24];
  int sn = snprintf(size, sizeof size, "%zx\r\n", n);
  if (c->coalesce) {
    sbuf_add(&c->wire, size, (size_t)sn);
    sbuf_add(&c->wire, p, n);
    sbuf_add(&c->wire, "\r\n", 2);
    return c->wire.len >= SIM_COALESCE_BYTES ? http_flush(c) : 0;
  }
  struct iovec iov[3] = {{size, (size_t)sn}, {(void *)p, n}, {"\r\n", 2}};
  return writev_all(c, iov, 3);
}

int http_chunk(conn *c, const char *p, size_t n) {
  if (n == 0) return 0; /* a zero-length chunk would end the body */
  if (!c->gzip) return raw_chunk(c, p, n);
  sbuf z = {0};
  gz_wrap(c, &z, p, n, c->gz_size == 0, false);
  int rc = raw_chunk(c, z.p, z.len);
  sbuf_free(&z);
  return rc;
}

int http_end_chunked(conn *c) {
  if (c->gzip) {
    sbuf z = {0};
    gz_wrap(c, &z, "", 0, c->gz_size == 0, true);
    int rc = raw_chunk(c, z.p, z.len);
    sbuf_free(&z);
    if (rc) return rc;
  }
  if (c->coalesce) {
    sbuf_add(&c->wire, "0\r\n\r\n", 5);
    return http_flush(c);
  }
  return http_write_all(c, "0\r\n\r\n", 5);
}

/* Has the peer closed (or reset) the connection? Pipelined request bytes
 * do not count. */
bool conn_gone(conn *c) { return sys_peer_gone(c->fd, 0) != 0; }

/* Sleep until the monotonic deadline, waking early if the peer goes away
 * (-1) or the cancel flag is raised (-2). Sub-millisecond rests use
 * nanosleep because poll() only has millisecond resolution. */
int conn_wait_until(conn *c, double deadline, atomic_bool *cancel) {
  if (http_flush(c)) return -1; /* what was gathered leaves before the wait */
  for (;;) {
    if (cancel && atomic_load(cancel)) return -2;
    double left = deadline - sim_now();
    if (left <= 0) return 0;
    if (left < 0.002) {
      struct timespec ts = {0, (long)(left * 1e9)};
      nanosleep(&ts, NULL);
      return conn_gone(c) ? -1 : 0;
    }
    int ms = (int)(left * 1000.0);
    if (ms > SIM_SLICE_MS) ms = SIM_SLICE_MS;
    if (sys_peer_gone(c->fd, ms)) return -1;
  }
}
