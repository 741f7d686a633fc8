/* log.h — messages to stderr with the program's prefix ("plait: ",
 * "plait-train: ") so an admin can grep a job log for them, and the way
 * they write a duration. */
#ifndef PLAIT_LOG_H
#define PLAIT_LOG_H

#include <stddef.h>

/* Sets the prefix (without ": "); default "plait". */
void log_set_prefix(const char *prefix);

/* Quiet: log_info says nothing (warnings and errors still do); for the ranks
 * other than 0 of a job, whose progress rank 0 reports. */
void log_set_quiet(int quiet);

void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* How many warnings this process has given so far (a progress line that is
 * usually skipped is printed beside one: runtime/report.c). */
unsigned log_warnings(void);

/* A duration for people: "42s", "3m07s", "2h05m"; "?" when not finite or
 * negative. */
void log_format_duration(char *buf, size_t bytes, double seconds);

#endif
