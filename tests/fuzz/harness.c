/* harness.c — the fuzz targets' private directory and file writing (see
 * harness.h). Nothing here reads the fuzzer's input. */
#include "tests/fuzz/harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static char dir[PATH_MAX];

static void remove_dir(void)
{
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    rmdir(dir);
}

const char *fuzz_dir(void)
{
    if (dir[0]) return dir;
    /* memory, not disk: a file is written for every input, and a busy disk
     * stalls a write long enough to look like a hang */
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0]) tmp = access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/plait-fuzz.XXXXXX", tmp);
    if (!mkdtemp(dir)) {
        fprintf(stderr, "fuzz: mkdtemp %s: %s\n", dir, strerror(errno));
        abort();
    }
    atexit(remove_dir);
    return dir;
}

const char *fuzz_path(const char *name)
{
    static char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    return path;
}

const char *fuzz_write(const char *name, const void *bytes, size_t n)
{
    const char *path = fuzz_path(name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "fuzz: %s: %s\n", path, strerror(errno));
        abort();
    }
    for (size_t done = 0; done < n;) {
        ssize_t w = write(fd, (const char *)bytes + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            fprintf(stderr, "fuzz: writing %s: %s\n", path, strerror(errno));
            abort();
        }
        done += (size_t)w;
    }
    close(fd);
    return path;
}

/* Length of the valid UTF-8 sequence at s (1..4; RFC 3629: no overlong forms,
 * no surrogates, nothing above U+10FFFF), or 0. */
static size_t utf8_length(const unsigned char *s)
{
    if (s[0] < 0x80) return 1;
    size_t len = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 0;
    if (len == 0 || s[0] > 0xF4) return 0;
    uint32_t cp = s[0] & (0x7Fu >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3Fu);
    }
    static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

void fuzz_check_message(const char *text)
{
    FUZZ_CHECK(text[0] != '\0', "an error without a message");
    for (const unsigned char *s = (const unsigned char *)text; *s;) {
        size_t len = utf8_length(s);
        FUZZ_CHECK(len > 0, "the error is not valid UTF-8 at byte %zu: %s",
                   (size_t)((const char *)s - text), text);
        FUZZ_CHECK(*s >= 0x20 && *s != 0x7F, "control character 0x%02x in the error: %s", *s, text);
        FUZZ_CHECK(!(s[0] == 0xC2 && s[1] < 0xA0), "C1 control U+%04X in the error: %s", s[1],
                   text);
        s += len;
    }
}
