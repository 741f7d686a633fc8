/* store_addr.c — what a launcher hands its ranks so they can find and join
 * the store: "host:port" written and read back, and a fresh per-job secret.
 * The env variables that carry them are named in env.h. */
#include "common/store/store.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

int store_secret_generate(char out[STORE_SECRET_HEX_BYTES], struct plait_error *err)
{
    uint8_t bytes[32];
    size_t got = 0;
    while (got < sizeof bytes) {
        ssize_t k = getrandom(bytes + got, sizeof bytes - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return error_errno(err, "store: getrandom for the job's secret");
        got += (size_t)k;
    }
    for (size_t i = 0; i < sizeof bytes; i++) snprintf(out + 2 * i, 3, "%02x", bytes[i]);
    explicit_bzero(bytes, sizeof bytes);
    return 0;
}

const char *store_secret_problem(const char *secret)
{
    if (strlen(secret) < 32) return "it is shorter than 32 characters";
    bool seen[256] = {false};
    int distinct = 0;
    for (const unsigned char *c = (const unsigned char *)secret; *c; c++)
        if (!seen[*c]) seen[*c] = true, distinct++;
    if (distinct < 8)
        return "it has fewer than 8 distinct characters (a placeholder such as all zeros, as in "
               "k8s/examples?)";
    return NULL;
}

int store_addr_format(char *out, size_t out_bytes, const char *host, int port,
                      struct plait_error *err)
{
    int n = snprintf(out, out_bytes, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    if (n < 0 || (size_t)n >= out_bytes)
        return error_set(err, "store: the address %s:%d is too long", host, port);
    return 0;
}

int store_addr_parse(const char *text, char *host, size_t host_bytes, int *port,
                     struct plait_error *err)
{
    const char *colon = strrchr(text, ':');
    const char *host_start = text, *host_end = colon;
    if (text[0] == '[') { /* [v6]:port */
        const char *close = strchr(text, ']');
        if (!close || close[1] != ':')
            return error_set(err, "store address \"%s\": not [host]:port", text);
        host_start = text + 1, host_end = close, colon = close + 1;
    } else if (colon && memchr(text, ':', (size_t)(colon - text))) {
        return error_set(err, "store address \"%s\": an IPv6 host needs brackets ([::1]:port)",
                         text);
    }
    if (!colon || host_end == host_start)
        return error_set(err, "store address \"%s\": not host:port", text);
    char *end;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end || p < 1 || p > 65535)
        return error_set(err, "store address \"%s\": the port is not 1..65535", text);
    size_t n = (size_t)(host_end - host_start);
    if (n >= host_bytes) return error_set(err, "store address \"%s\": the host is too long", text);
    memcpy(host, host_start, n);
    host[n] = '\0';
    *port = (int)p;
    return 0;
}
