/* test_hostlist.c — Slurm's compressed host lists as plait launch reads
 * SLURM_STEP_NODELIST: ranges with their zero padding, several groups in one
 * name, plain names between them, and what is malformed refused. */
#include <string.h>

#include "check.h"
#include "common/hostlist.h"

/* every name of list, joined by spaces */
static const char *names(const char *list)
{
    static char out[4096];
    static struct plait_error err;
    char name[HOSTLIST_NAME_BYTES];
    int n = hostlist_count(list, &err);
    out[0] = '\0';
    if (n < 0) return err.text;
    for (int i = 0; i < n; i++) {
        if (hostlist_nth(list, i, name, &err)) return err.text;
        strcat(out, i ? " " : "");
        strcat(out, name);
    }
    return out;
}

static void test_ranges_keep_their_padding_and_order(void)
{
    CHECK(!strcmp(names("node[01-04,07],gpu3"), "node01 node02 node03 node04 node07 gpu3"), "%s",
          names("node[01-04,07],gpu3"));
    CHECK(!strcmp(names("n[08-10]"), "n08 n09 n10"), "%s", names("n[08-10]"));
    CHECK(!strcmp(names("n[9-11]"), "n9 n10 n11"), "%s", names("n[9-11]"));
    CHECK(!strcmp(names("node1"), "node1"), "%s", names("node1"));
    CHECK(!strcmp(names("node[1-2]"), "node1 node2"), "%s", names("node[1-2]"));
}

static void test_several_groups_expand_rightmost_fastest(void)
{
    CHECK(!strcmp(names("r[1-2]-n[1,3]"), "r1-n1 r1-n3 r2-n1 r2-n3"), "%s",
          names("r[1-2]-n[1,3]"));
    CHECK(!strcmp(names("a,b[1-2]c,d"), "a b1c b2c d"), "%s", names("a,b[1-2]c,d"));
}

static void test_the_nth_name_and_past_the_end(void)
{
    struct plait_error err;
    char name[HOSTLIST_NAME_BYTES];
    CHECK(hostlist_nth("node[01-04,07],gpu3", 0, name, &err) == 0 && !strcmp(name, "node01"),
          "%s", name);
    CHECK(hostlist_nth("node[01-04,07],gpu3", 4, name, &err) == 0 && !strcmp(name, "node07"),
          "%s", name);
    CHECK(hostlist_nth("node[1-2]", 2, name, &err) == -1 && strstr(err.text, "has 2 names"), "%s",
          err.text);
    CHECK(hostlist_count("big[1-65536]", &err) == 65536, "%s", err.text);
}

static void test_malformed_lists_are_refused(void)
{
    struct plait_error err;
    const char *bad[] = {"", "node[3-1]", "node[1-2", "node1]", "node[]", "n[a-b]", "a,,b",
                         "n[1-2],", "big[1-70000]", "x[1-300]y[1-300]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(hostlist_count(bad[i], &err) == -1, "\"%s\" was accepted", bad[i]);
    CHECK(hostlist_count("node[3-1]", &err) == -1 && strstr(err.text, "bad range"), "%s",
          err.text);
}

int main(void)
{
    RUN(test_ranges_keep_their_padding_and_order);
    RUN(test_several_groups_expand_rightmost_fastest);
    RUN(test_the_nth_name_and_past_the_end);
    RUN(test_malformed_lists_are_refused);
    return check_exit_code();
}
