/* test_ckptdir.c — checkpoint directories on a real file system (a temp
 * directory): names past 10^8 steps order by number, every state a crash can
 * leave between the system calls of a commit recovers to a complete
 * checkpoint, failures leave no temporaries, and pruning counts only
 * checkpoints that verify. The files' contents are stand-ins. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "common/formats/ckptdir.h"
#include "common/fsutil.h"

/* paths here are short temp paths; the 4096-byte buffers only look tight to gcc */
#pragma GCC diagnostic ignored "-Wformat-truncation"

static char root[] = "/tmp/plait-test-ckptdir.XXXXXX";

static bool exists(const char *dir, const char *name)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

/* A checkpoint `name` in d whose model.bin holds `tag` (for telling copies apart). */
static int write_checkpoint(struct ckptdir *d, const char *name, const char *tag)
{
    char tmp[4096];
    struct plait_error err;
    struct ckpt_manifest files = {0};
    static const char *const names[] = {"model.bin", "optim.bin", "state.json"};
    int rc = ckptdir_begin(d, name, tmp, sizeof tmp, &err);
    for (int i = 0; i < 3 && rc == 0; i++) {
        struct ckpt_file f;
        rc = ckpt_file_open(&f, tmp, names[i], &err) || ckpt_file_put(&f, tag, strlen(tag), &err) ||
                     ckpt_file_close(&f, &files, &err)
                 ? -1
                 : 0;
    }
    if (rc == 0) rc = ckptdir_commit(d, name, tmp, &files, NULL, &err);
    ckpt_manifest_free(&files);
    if (rc) printf("  write_checkpoint %s: %s\n", name, err.text);
    return rc;
}

static char *model_of(const char *dir, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/model.bin", dir, name);
    return fs_read_all(path, NULL, NULL);
}

/* A fresh directory under root for one test. */
static const char *fresh_dir(const char *name)
{
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, name);
    fs_remove_tree(path, NULL);
    return path;
}

static void test_names_past_ten_to_the_eighth_order_by_number(void)
{
    struct ckptdir d;
    struct plait_error err;
    CHECK(ckptdir_open(&d, fresh_dir("names"), &err) == 0, "%s", err.text);
    char name[48];
    ckptdir_name(name, sizeof name, 100000000, 0);
    CHECK(!strcmp(name, "step_100000000_0000"), "%s", name);
    const long long steps[][2] = {{99999999, 12345}, {100000000, 0}, {7, 2}, {2147483647, 3}};
    for (int i = 0; i < 4; i++) {
        ckptdir_name(name, sizeof name, steps[i][0], steps[i][1]);
        CHECK(write_checkpoint(&d, name, "x") == 0, "%s", name);
    }
    /* names that only look like ours are not listed */
    char path[4096];
    const char *foreign[] = {"step_000000001_0000", "step_00000001_0000x", "step_-0000001_0000",
                             "step_00000001_000", "step_00000001"};
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/%s", d.path, foreign[i]);
        mkdir(path, 0777);
    }
    struct ckpt_entry *list;
    int n;
    CHECK(ckptdir_list(&d, &list, &n, &err) == 0, "%s", err.text);
    CHECK(n == 4, "%d listed", n);
    const char *want[] = {"step_2147483647_0003", "step_100000000_0000", "step_99999999_12345",
                          "step_00000007_0002"};
    for (int i = 0; i < n && i < 4; i++)
        CHECK(!strcmp(list[i].name, want[i]), "%d: %s, want %s", i, list[i].name, want[i]);
    free(list);
    ckptdir_close(&d);
}

static void test_resave_replaces_the_old_copy(void)
{
    struct ckptdir d;
    struct plait_error err;
    CHECK(ckptdir_open(&d, fresh_dir("resave"), &err) == 0, "%s", err.text);
    CHECK(write_checkpoint(&d, "step_00000004_0000", "old") == 0, "first");
    CHECK(write_checkpoint(&d, "step_00000004_0000", "new") == 0, "second");
    char *m = model_of(d.path, "step_00000004_0000");
    CHECK(m && !strcmp(m, "new"), "%s", m ? m : "(none)");
    free(m);
    CHECK(!exists(d.path, ".old-step_00000004_0000"), "old copy left");
    CHECK(!exists(d.path, ".tmp-step_00000004_0000"), "temporary left");
    ckptdir_close(&d);
}

/* The states a crash leaves between the system calls of a re-save, built on
 * disk; opening the directory must lead back to a complete checkpoint. */
static void test_every_interrupted_commit_recovers(void)
{
    struct plait_error err;
    const char *name = "step_00000004_0000";
    const struct {
        const char *state;
        bool has_final, has_old, has_tmp, tmp_complete;
        const char *want; /* the model.bin it must end with */
        const char *old_prefix;
    } cases[] = {
        {"new copy half written", true, false, true, false, "old", ".old-"},
        {"new copy complete, not yet renamed", true, false, true, true, "old", ".old-"},
        {"old copy moved aside, new complete", false, true, true, true, "new", ".old-"},
        {"old copy moved aside, new incomplete", false, true, true, false, "old", ".old-"},
        {"old copy moved aside, no new copy", false, true, false, false, "old", ".old-"},
        {"new copy in place, old not yet removed", true, true, false, false, "new", ".old-"},
        {"an older plait's aside name", false, true, true, true, "new", ".tmp-old-"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char dir[4096], path[4096], scratch[4096];
        snprintf(dir, sizeof dir, "%s", fresh_dir("recover"));
        snprintf(scratch, sizeof scratch, "%s/../scratch", dir);
        fs_remove_tree(scratch, NULL);
        struct ckptdir s, d;
        /* complete "old" and "new" copies to arrange */
        CHECK(ckptdir_open(&s, scratch, &err) == 0, "%s", err.text);
        write_checkpoint(&s, "step_00000001_0000", "old");
        write_checkpoint(&s, "step_00000002_0000", "new");
        ckptdir_close(&s);
        fs_mkdir_p(dir, &err);
        char src[4096], dst[4096];
        if (cases[i].has_final) {
            snprintf(src, sizeof src, "%s/%s", scratch,
                     cases[i].has_old ? "step_00000002_0000" : "step_00000001_0000");
            snprintf(dst, sizeof dst, "%s/%s", dir, name);
            rename(src, dst);
        }
        if (cases[i].has_old) {
            snprintf(src, sizeof src, "%s/step_00000001_0000", scratch);
            snprintf(dst, sizeof dst, "%s/%s%s", dir, cases[i].old_prefix, name);
            rename(src, dst);
        }
        if (cases[i].has_tmp) {
            snprintf(src, sizeof src, "%s/step_00000002_0000", scratch);
            snprintf(dst, sizeof dst, "%s/.tmp-%s", dir, name);
            rename(src, dst);
            if (!cases[i].tmp_complete) {
                snprintf(path, sizeof path, "%s/manifest.json", dst);
                unlink(path);
            }
        }
        CHECK(ckptdir_open(&d, dir, &err) == 0, "%s: %s", cases[i].state, err.text);
        char *m = model_of(dir, name);
        CHECK(m && !strcmp(m, cases[i].want), "%s: model.bin %s, want %s", cases[i].state,
              m ? m : "(none)", cases[i].want);
        free(m);
        CHECK(ckptdir_verify(&d, name, &err) == 0, "%s: %s", cases[i].state, err.text);
        struct ckpt_entry *list;
        int n;
        ckptdir_list(&d, &list, &n, &err);
        CHECK(n == 1, "%s: %d checkpoints", cases[i].state, n);
        free(list);
        snprintf(path, sizeof path, "%s", dir);
        CHECK(!exists(path, ".tmp-step_00000004_0000") &&
                  !exists(path, ".old-step_00000004_0000") &&
                  !exists(path, ".tmp-old-step_00000004_0000"),
              "%s: temporaries left", cases[i].state);
        ckptdir_close(&d);
        fs_remove_tree(scratch, NULL);
    }
}

static void test_failed_commit_leaves_no_temporary(void)
{
    struct ckptdir d;
    struct plait_error err;
    CHECK(ckptdir_open(&d, fresh_dir("fail"), &err) == 0, "%s", err.text);
    char tmp[4096];
    CHECK(ckptdir_begin(&d, "step_00000001_0000", tmp, sizeof tmp, &err) == 0, "%s", err.text);
    struct ckpt_manifest files = {0};
    CHECK(ckptdir_commit(&d, "not-a-name", tmp, &files, NULL, &err) != 0, "accepted a bad name");
    /* a commit whose manifest cannot be written: the temporary is a file, not a directory */
    CHECK(ckptdir_begin(&d, "step_00000002_0000", tmp, sizeof tmp, &err) == 0, "%s", err.text);
    char manifest_dir[4096];
    snprintf(manifest_dir, sizeof manifest_dir, "%s/manifest.json.tmp", tmp);
    mkdir(manifest_dir, 0777); /* fs_write_atomic cannot create its temp file */
    CHECK(ckptdir_commit(&d, "step_00000002_0000", tmp, &files, NULL, &err) != 0,
          "commit succeeded");
    ckpt_manifest_free(&files);
    CHECK(!exists(d.path, ".tmp-step_00000002_0000"), "temporary left after a failed commit");
    CHECK(!exists(d.path, "step_00000002_0000"), "a failed commit became visible");
    ckptdir_close(&d);
    /* what a crashed writer left (the temporary of step 1 above) goes at the next open */
    char path[4096];
    snprintf(path, sizeof path, "%s/fail", root);
    CHECK(exists(path, ".tmp-step_00000001_0000"), "the setup left no temporary");
    CHECK(ckptdir_open(&d, path, &err) == 0, "%s", err.text);
    CHECK(!exists(path, ".tmp-step_00000001_0000"), "abandoned temporary not removed");
    ckptdir_close(&d);
}

static void test_prune_counts_only_checkpoints_that_verify(void)
{
    struct ckptdir d;
    struct plait_error err;
    CHECK(ckptdir_open(&d, fresh_dir("prune"), &err) == 0, "%s", err.text);
    write_checkpoint(&d, "step_00000004_0000", "a");
    write_checkpoint(&d, "step_00000006_0001", "b");
    ckptdir_close(&d);
    /* the newest is damaged, as a preemption on a failing disk might leave it */
    char path[4096];
    snprintf(path, sizeof path, "%s/prune/step_00000006_0001/model.bin", root);
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
    snprintf(path, sizeof path, "%s/prune", root);
    CHECK(ckptdir_open(&d, path, &err) == 0, "%s", err.text);
    CHECK(ckptdir_verify(&d, "step_00000006_0001", &err) != 0, "a truncated file verified");
    write_checkpoint(&d, "step_00000006_0000", "c");
    ckptdir_prune(&d, 2);
    CHECK(exists(path, "step_00000006_0000") && exists(path, "step_00000004_0000"),
          "a good checkpoint was pruned while a corrupt one counted");
    write_checkpoint(&d, "step_00000008_0000", "d");
    ckptdir_prune(&d, 2);
    CHECK(exists(path, "step_00000008_0000") && exists(path, "step_00000006_0000"),
          "the newest two good checkpoints must stay");
    CHECK(!exists(path, "step_00000004_0000"), "an old checkpoint beyond keep stayed");
    ckptdir_close(&d);
}

int main(void)
{
    if (!mkdtemp(root)) return 1;
    RUN(test_names_past_ten_to_the_eighth_order_by_number);
    RUN(test_resave_replaces_the_old_copy);
    RUN(test_every_interrupted_commit_recovers);
    RUN(test_failed_commit_leaves_no_temporary);
    RUN(test_prune_counts_only_checkpoints_that_verify);
    fs_remove_tree(root, NULL);
    return check_exit_code();
}
