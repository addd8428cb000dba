/*
 * stream.h - internals shared by stream.c (the token loop), finish.c (the
 * final frames and non-streamed bodies) and replay.c. Not part of the
 * simulator's wider interface, hence apart from sim.h.
 */
#ifndef MIRZA_SIM_STREAM_H
#define MIRZA_SIM_STREAM_H

#include "sim.h"

void frame_open(job *j, const char *finish);
void frame_open_at(job *j, const char *finish, int index); /* choice index's frame */
void frame_close(job *j, const char *finish, const char *extra);
void role_frame(job *j);
void text_frame(job *j, const char *tok, size_t n, const char *finish, const char *extra);
void job_flush(job *j);
int finish_ok(job *j, const char *finish);
void finish_error(job *j);

#endif
