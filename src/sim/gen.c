/*
 * gen.c - deterministic text: words, sentences, token sequences.
 *
 * A token is one word plus the spaces or punctuation that follow it, which is
 * close enough to a BPE token for a client's point of view (one frame each).
 * Text is produced on the fly from a splitmix64 stream seeded by (--seed,
 * last user message), so 200k-token streams cost no memory and the same
 * prompt always gives the same text. Sentences follow a tiny word-class
 * grammar (determiner, adjective, noun, verb, ...) in French or English so
 * the output looks like prose in demos; sentence lengths are planned so the
 * text ends exactly on a full stop after the requested number of tokens.
 */
#include <string.h>

#include "sim.h"

enum { W_DET, W_ADJ, W_NOUN, W_VERB, W_ADV, W_PREP, W_CONJ, W_OPEN, W_NCLASS };

#define LIST(...)                                                                                                      \
  { __VA_ARGS__, NULL }
static const char *const en_words[W_NCLASS][24] = {
    [W_DET] = LIST("the", "a", "this", "that", "every", "our", "each", "one", "some", "the"),
    [W_ADJ] = LIST("small", "clear", "simple", "quick", "careful", "local", "new", "long", "short", "useful", "strange",
                   "quiet", "better", "whole"),
    [W_NOUN] = LIST("model", "answer", "question", "server", "stream", "idea", "answer", "token", "cache", "session",
                    "result", "client", "problem", "user", "context", "request", "reason", "example", "window", "test"),
    [W_VERB] = LIST("explains", "needs", "keeps", "shows", "follows", "changes", "finds", "checks", "returns",
                    "describes", "reads", "builds", "helps", "uses", "gives", "takes"),
    [W_ADV] = LIST("quickly", "again", "often", "clearly", "still", "slowly", "always", "really", "here", "now"),
    [W_PREP] =
        LIST("with", "for", "from", "about", "after", "before", "into", "under", "through", "without", "near", "over"),
    [W_CONJ] = LIST("and", "but", "so", "because", "while", "and"),
    [W_OPEN] = LIST("First,", "So", "Then", "Okay,", "Wait,", "Hmm,", "Now", "Also,"),
};
static const char *const fr_words[W_NCLASS][24] = {
    [W_DET] = LIST("le", "la", "un", "une", "ce", "cette", "chaque", "notre", "le", "la"),
    [W_ADJ] = LIST("petit", "clair", "simple", "rapide", "nouveau", "long", "court", "utile", "étrange", "calme",
                   "meilleur", "entier", "précis"),
    [W_NOUN] = LIST("modèle", "réponse", "question", "serveur", "flux", "idée", "jeton", "cache", "session", "résultat",
                    "client", "problème", "contexte", "requête", "raison", "exemple", "fenêtre", "été", "café", "test"),
    [W_VERB] = LIST("explique", "garde", "montre", "suit", "change", "trouve", "vérifie", "renvoie", "décrit", "lit",
                    "construit", "aide", "utilise", "donne", "prend", "attend"),
    [W_ADV] = LIST("vite", "encore", "souvent", "clairement", "toujours", "lentement", "vraiment", "ici", "déjà",
                   "maintenant"),
    [W_PREP] =
        LIST("avec", "pour", "dans", "sans", "après", "avant", "sous", "vers", "depuis", "chez", "pendant", "contre"),
    [W_CONJ] = LIST("et", "mais", "donc", "car", "puis", "et"),
    [W_OPEN] = LIST("D'abord,", "Donc", "Ensuite,", "Bon,", "Attends,", "Hmm,", "Alors", "Aussi,"),
};
#undef LIST

const char SIM_UTF8_PREFIX[] = "Voilà : un café à 3 €, au Japon 日本 🙂. ";
const char SIM_LOOP_LINE[] = "Wait, let me reconsider the question.\n";
const char SIM_LOOP_PHRASE[] = "and so on ";

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static unsigned pick(uint64_t *s, unsigned n) { return (unsigned)(splitmix(s) % n); }

uint64_t gen_hash(uint64_t seed, const char *s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
  return h;
}

void gen_init(sim_gen *g, uint64_t seed, long words, bool reasoning, char end_sep) {
  memset(g, 0, sizeof *g);
  g->rng = seed;
  g->remaining = words;
  g->reasoning = reasoning;
  g->end_sep = end_sep;
  g->fr = pick(&g->rng, 2) == 0;
}

static const char *word_of(sim_gen *g, int cls) {
  const char *const *list = g->fr ? fr_words[cls] : en_words[cls];
  unsigned n = 0;
  while (list[n]) n++;
  return list[pick(&g->rng, n)];
}

/* The word-class grammar: which class may follow the previous one. The last
 * word of a sentence is always a noun so sentences never end on "the". */
static int next_class(sim_gen *g) {
  if (g->words_left == 1) return W_NOUN;
  switch (g->cls) {
  case W_DET: return pick(&g->rng, 10) < 3 ? W_ADJ : W_NOUN;
  case W_ADJ: return W_NOUN;
  case W_NOUN:
    if (!g->has_verb) return W_VERB;
    return pick(&g->rng, 4) == 0 ? W_CONJ : W_PREP;
  case W_VERB: {
    unsigned r = pick(&g->rng, 10);
    return r < 3 ? W_ADV : r < 6 ? W_PREP : W_DET;
  }
  case W_ADV: return pick(&g->rng, 2) ? W_PREP : W_DET;
  default: return W_DET; /* after PREP, CONJ, OPEN or at sentence start */
  }
}

/* Choose the next sentence's length so that the text ends on a full stop:
 * a tail too short for a sentence is folded into this one. */
static void start_sentence(sim_gen *g) {
  long len = 5 + (long)pick(&g->rng, 11);
  if (g->remaining - len < 4) len = g->remaining;
  g->words_left = (int)len;
  g->cls = -1;
  g->has_verb = false;
  g->cap_next = true;
  if (g->reasoning && len > 5 && pick(&g->rng, 5) < 2) g->cls = W_OPEN;
}

static char sentence_end(sim_gen *g) {
  unsigned r = pick(&g->rng, 20);
  return r < 2 ? '?' : r < 3 && !g->reasoning ? '!' : '.';
}

/* What follows the word just produced: a space, a comma, a full stop and a
 * space or newline, or nothing at the very end. */
static void add_separator(sim_gen *g, size_t *n) {
  char *t = g->tok;
  if (g->words_left == 0) {
    t[(*n)++] = sentence_end(g);
    if (g->remaining == 0) {
      if (g->end_sep) t[(*n)++] = g->end_sep;
      return;
    }
    t[(*n)++] = g->reasoning && pick(&g->rng, 2) ? '\n' : ' ';
    return;
  }
  if (g->cls == W_NOUN && g->has_verb && g->words_left > 3 && pick(&g->rng, 8) == 0) t[(*n)++] = ',';
  t[(*n)++] = ' ';
}

/* Produce the next word token into g->tok; 0 when the text is complete. */
static size_t gen_next(sim_gen *g, const char **tok) {
  if (g->remaining <= 0) return 0;
  if (g->words_left == 0) start_sentence(g);
  int cls = g->cls == W_OPEN ? W_OPEN : next_class(g);
  if (g->cls == W_OPEN && g->words_left > 1) g->cls = -2; /* opener used: the grammar restarts after it */
  else g->cls = cls;
  const char *w = word_of(g, cls);
  size_t n = strlen(w);
  memcpy(g->tok, w, n);
  if (g->cap_next && g->tok[0] >= 'a' && g->tok[0] <= 'z') g->tok[0] = (char)(g->tok[0] - 'a' + 'A');
  g->cap_next = false;
  if (cls == W_VERB) g->has_verb = true;
  if (cls == W_CONJ) g->has_verb = false;
  g->words_left--;
  g->remaining--;
  add_separator(g, &n);
  *tok = g->tok;
  return n;
}

/* Split exact text into tokens: leading blanks, a run of non-blank bytes,
 * then the blanks after it. Multi-byte characters are never split here. */
size_t text_next(const char *s, size_t len, size_t *pos, const char **tok) {
  size_t i = *pos;
  if (i >= len) return 0;
#define BLANK(c) ((c) == ' ' || (c) == '\n' || (c) == '\t' || (c) == '\r')
  while (i < len && BLANK(s[i])) i++;
  while (i < len && !BLANK(s[i])) i++;
  while (i < len && BLANK(s[i])) i++;
#undef BLANK
  *tok = s + *pos;
  size_t n = i - *pos;
  *pos = i;
  return n;
}

size_t tokseq_next(tokseq *t, const char **tok) {
  size_t n;
  if (t->pre && (n = text_next(t->pre, t->pre_len, &t->pre_pos, tok))) return n;
  if (t->text) n = text_next(t->text, t->text_len, &t->text_pos, tok);
  else n = gen_next(&t->gen, tok);
  if (n || !t->loop) return n;
  if (t->loop_pos >= t->loop_len) t->loop_pos = 0;
  return text_next(t->loop, t->loop_len, &t->loop_pos, tok);
}
