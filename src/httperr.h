/*
 * httperr.h - what httperr.c offers beyond decode.h's HTTP error message:
 * the one line a response body says, alone (no "HTTP <status>" before
 * it), for messages about a 2xx that is not the answer asked for.
 */
#ifndef MIRZA_HTTPERR_H
#define MIRZA_HTTPERR_H

#include <stddef.h>

/* The line mz_http_error_message shows after the status: an HTML page's
 * <title> (else its first line of text), a JSON error's message, or the
 * first line of a text body, whitespace collapsed; cut to outlen - 1
 * bytes on a UTF-8 boundary, with "..." when shortened. "" when the body
 * says nothing. Returns out. */
char *mz_http_summary(const char *body, size_t len, char *out, size_t outlen);

#endif
