/*
 * guard.h - the repetition guard's rules over streamed text (the policy
 * mirza.repetition sets the thresholds and wraps it as a stage): pure C,
 * no Lua, no I/O.
 *
 * Text comes in arbitrary pieces (a delta, a byte, a whole answer) and the
 * verdict is the same whatever the cut. Three rules, on two views:
 *
 * Segments: the text cut into lines and sentences (at "\n", and after
 * . ! ? or an ellipsis, maybe followed by closers " ' ) ], then white
 * space). A segment's key is its text lower-cased (ASCII), white space
 * collapsed, a leading bullet, list marker ("- ", "* ", "12. ") and the
 * trailing punctuation removed; one with fewer than min_letters letters
 * (ASCII or any byte >= 0x80) is ignored.
 *  - cycle: the last segments repeat with a cycle of 1..max_cycle
 *    segments, `repeats` times in a row;
 *  - count: the newest prose segment occurs `count` times among the last
 *    `window` (code lines and lines inside ``` fences never count).
 * Characters: the text lower-cased, white space runs as one " " (or "\n"
 * when they hold a line break), its last max(1024, max_phrase *
 * line_repeats * 2) bytes (cut to 3/4 of that when over).
 *  - phrase: the tail is periodic with a unit of at most max_phrase bytes
 *    repeated phrase_repeats times over phrase_min_chars bytes; the
 *    smallest such period decides: a unit with fewer than
 *    phrase_min_letters letters never counts, one holding a line break
 *    needs line_repeats repetitions.
 *
 * These are exactly the verdicts, lines and counts of the Lua guard it
 * replaced (tests/lua/repetition_ref.lua, held to by repetition_spec).
 */
#ifndef MIRZA_GUARD_H
#define MIRZA_GUARD_H

#include <stddef.h>

/* The thresholds (mirza.repetition.DEFAULTS names them, and gives the
 * defaults): numbers, fractions allowed where a count is compared. */
typedef struct mz_guard_opts {
  double repeats, max_cycle, count, window, min_letters;
  double phrase_repeats, phrase_min_chars, max_phrase, phrase_min_letters, line_repeats;
} mz_guard_opts;

typedef enum { MZ_GUARD_NONE, MZ_GUARD_CYCLE, MZ_GUARD_COUNT, MZ_GUARD_PHRASE } mz_guard_rule;

typedef struct mz_guard mz_guard;

/* A new guard (NULL: out of memory). The thresholds are copied. */
mz_guard *mz_guard_new(const mz_guard_opts *o);
void mz_guard_free(mz_guard *g);

/* Feed a piece of text. Returns 1 once a rule triggered (and from then on,
 * taking no more text), 0 if not, -1 out of memory (the piece is then
 * taken only in part: the guard is unreliable, free it). */
int mz_guard_feed(mz_guard *g, const char *s, size_t n);
/* Feed a piece, then judge the text not yet cut into segments as one (the
 * end of the text). Returns as mz_guard_feed. */
int mz_guard_check(mz_guard *g, const char *s, size_t n);

/* The report once triggered: the rule, the repeated line, sentence or
 * phrase (the original text of a segment; the phrase normalised), and how
 * many times it came back. */
mz_guard_rule mz_guard_rule_of(const mz_guard *g);
const char *mz_guard_rule_name(mz_guard_rule r); /* "cycle", "count", "phrase"; NULL for none */
const char *mz_guard_line(const mz_guard *g, size_t *len);
long mz_guard_count(const mz_guard *g);

#endif
