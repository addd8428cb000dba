/*
 * url.c - URLs as they may be shown, and whether a credential would go in
 * clear (client.h: mz_redact_url, mz_is_secret, mz_url_plain_remote).
 * Pure text: no curl, no DNS, no allocation but the result. The list of
 * credential words is here only: lua/mirza/record.lua asks it through
 * mirza.core.is_secret, so a message of the core and a recording agree on
 * what is hidden: the userinfo, and the value of each query parameter (or
 * header) whose name looks like a credential.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "client.h"

int mz_is_secret(const char *name, size_t len) {
  static const char *const words[] = {"auth", "cookie", "key", "token", "secret", "password", "passwd", NULL};
  for (int w = 0; words[w]; w++) {
    size_t n = strlen(words[w]);
    for (size_t i = 0; i + n <= len; i++)
      if (strncasecmp(name + i, words[w], n) == 0) return 1;
  }
  return 0;
}

/* Where the userinfo of url ends (its '@'), or NULL: the authority runs
 * from after "scheme://" (or the start, for a scheme-less URL as libcurl
 * guesses it) to the first '/', '?' or '#'. */
static const char *userinfo_end(const char *url, const char **start) {
  const char *a = url, *sep = strstr(url, "://");
  if (sep && sep > url && isalpha((unsigned char)*url) &&
      strspn(url, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-") == (size_t)(sep - url))
    a = sep + 3;
  const char *end = a + strcspn(a, "/?#"), *at = NULL;
  for (const char *p = a; p < end; p++)
    if (*p == '@') at = p;
  *start = a;
  return at;
}

/* One pass of the rule into out (cap bytes, NUL-terminated when cap > 0);
 * returns the length of the whole result, like snprintf. */
static size_t redact_into(const char *url, char *out, size_t cap) {
  size_t n = 0;
#define PUT(p, len)                                                                                                    \
  do {                                                                                                                 \
    size_t l_ = (len);                                                                                                 \
    if (n < cap) memcpy(out + n, (p), l_ < cap - n ? l_ : cap - n);                                                    \
    n += l_;                                                                                                           \
  } while (0)
  const char *a, *at = userinfo_end(url, &a), *p = url;
  if (at) {
    PUT(url, (size_t)(a - url));
    PUT("[redacted]", 10);
    p = at;
  }
  while (*p) { /* as record.lua's gsub("([?&])([^=&#]+)=([^&#]*)") */
    size_t k = (*p == '?' || *p == '&') ? strcspn(p + 1, "=&#") : 0;
    if (!k || p[1 + k] != '=') {
      PUT(p, 1);
      p++;
      continue;
    }
    const char *v = p + 2 + k;
    size_t vl = strcspn(v, "&#");
    PUT(p, 2 + k);
    if (mz_is_secret(p + 1, k)) PUT("[redacted]", 10);
    else PUT(v, vl);
    p = v + vl;
  }
#undef PUT
  if (cap) out[n < cap ? n : cap - 1] = '\0';
  return n;
}

/* A host name or address literal (len bytes) that means this machine. */
static int loopback_host(const char *h, size_t len) {
  char buf[256];
  struct in_addr a4;
  struct in6_addr a6;
  if (len && h[len - 1] == '.') len--; /* "localhost." */
  if (!len || len >= sizeof buf) return 0;
  memcpy(buf, h, len);
  buf[len] = '\0';
  if (buf[0] == '[') { /* [::1], [::ffff:127.0.0.1], a zone after % */
    buf[strcspn(buf, "]%")] = '\0';
    if (inet_pton(AF_INET6, buf + 1, &a6) != 1) return 0;
    if (IN6_IS_ADDR_LOOPBACK(&a6)) return 1;
    return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
  }
  if (inet_aton(buf, &a4)) return (ntohl(a4.s_addr) >> 24) == 127; /* also 127.1, as libcurl reads it */
  if (strcasecmp(buf, "localhost") == 0) return 1;
  const char *dot = strrchr(buf, '.'); /* a name under .localhost (RFC 6761) */
  return dot && dot > buf && strcasecmp(dot, ".localhost") == 0;
}

int mz_url_plain_remote(const char *url) {
  const char *a, *at = userinfo_end(url, &a), *sep = strstr(url, "://");
  if (a != url && !(sep + 3 == a && sep - url == 4 && strncasecmp(url, "http", 4) == 0)) return 0; /* https, ... */
  const char *h = at ? at + 1 : a, *end = h + strcspn(h, "/?#");
  const char *colon = *h == '[' ? memchr(h, ']', (size_t)(end - h)) : h;
  colon = colon ? memchr(colon, ':', (size_t)(end - colon)) : NULL;
  size_t len = (size_t)((colon ? colon : end) - h);
  return len > 0 && !loopback_host(h, len);
}

char *mz_redact_url(const char *url) {
  size_t n = redact_into(url, NULL, 0);
  char *out = malloc(n + 1);
  if (out) redact_into(url, out, n + 1);
  return out;
}
