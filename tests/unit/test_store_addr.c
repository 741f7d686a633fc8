/* test_store_addr.c — where a store is reached: the server binds IPv6, IPv4
 * and host names and refuses an empty secret, and store_addr.c's helpers
 * format and parse host:port and generate secrets. Not what is said over the
 * connection (test_store.c). */
#include <netinet/in.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "store_harness.h"

static void test_server_binds_ipv6_and_ipv4_and_host_names(void)
{
    struct store_server *srv = NULL;
    struct store *st = NULL;
    struct plait_error err;
    bool have_v6 = true;
    int probe = socket(AF_INET6, SOCK_STREAM, 0);
    if (probe < 0) have_v6 = false;
    struct sockaddr_in6 lo = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    if (probe >= 0 && bind(probe, (struct sockaddr *)&lo, sizeof lo) != 0) have_v6 = false;
    if (probe >= 0) close(probe);
    static const struct {
        const char *bind, *host;
    } cases[] = {{"0.0.0.0", "127.0.0.1"}, {"localhost", "localhost"},
                 {NULL, "127.0.0.1"},      {"::", "::1"},
                 {"::", "127.0.0.1"},      {NULL, "::1"}};
    for (int i = 0; i < (have_v6 ? 6 : 3); i++) {
        const char *bind_text = cases[i].bind ? cases[i].bind : "NULL";
        CHECK(store_server_start(&srv, cases[i].bind, 0, SECRET, &err) == 0, "%s: %s", bind_text,
              err.text);
        if (!srv) continue;
        CHECK(store_connect(&st, cases[i].host, store_server_port(srv), SECRET, 0, 5, &err) == 0,
              "bind %s, connect %s: %s", bind_text, cases[i].host, err.text);
        store_close(st);
        st = NULL;
        store_server_stop(srv);
        srv = NULL;
    }
    CHECK(store_server_start(&srv, "127.0.0.1", 0, "", &err) != 0, "an empty secret");
    CHECK(store_server_start(&srv, "no-such-host.invalid", 0, SECRET, &err) != 0 &&
              strstr(err.text, "no-such-host.invalid"),
          "%s", err.text);
}

static void test_address_and_secret_helpers(void)
{
    char out[64], host[64];
    int port = 0;
    struct plait_error err;
    CHECK(store_addr_format(out, sizeof out, "::1", 29500, &err) == 0 &&
              !strcmp(out, "[::1]:29500"),
          "%s", out);
    CHECK(store_addr_parse(out, host, sizeof host, &port, &err) == 0 && !strcmp(host, "::1") &&
              port == 29500,
          "%s %d", host, port);
    CHECK(store_addr_parse("node-7.cluster:1234", host, sizeof host, &port, &err) == 0 &&
              !strcmp(host, "node-7.cluster") && port == 1234,
          "%s", host);
    const char *bad[] = {"node",       "node:",    ":12",   "node:0",
                         "node:70000", "node:12x", "::1:5", "[::1]5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(store_addr_parse(bad[i], host, sizeof host, &port, &err) != 0, "%s", bad[i]);
    char a[STORE_SECRET_HEX_BYTES], b[STORE_SECRET_HEX_BYTES];
    CHECK(store_secret_generate(a, &err) == 0 && store_secret_generate(b, &err) == 0, "%s",
          err.text);
    CHECK(strlen(a) == 64 && strspn(a, "0123456789abcdef") == 64 && strcmp(a, b), "%s %s", a, b);
}

int main(void)
{
    RUN(test_address_and_secret_helpers);
    RUN(test_server_binds_ipv6_and_ipv4_and_host_names);
    return check_exit_code();
}
