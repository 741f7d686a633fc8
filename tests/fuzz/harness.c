/* harness.c — the fuzz targets' files (memfds and pipes at fixed descriptors),
 * private directory and error-message check (see harness.h). Nothing here
 * reads the fuzzer's input. */
#include "tests/fuzz/harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum kind { NONE, MEMFD, PIPE };

static enum kind kinds[FUZZ_FDS];
static int writers[FUZZ_FDS]; /* the write end of a PIPE */

static int slot(int fd)
{
    FUZZ_CHECK(fd >= FUZZ_FD && fd < FUZZ_FD + FUZZ_FDS, "descriptor %d is not the harness's", fd);
    return fd - FUZZ_FD;
}

/* Moves descriptor from onto fd (closing from). */
static void place(int from, int fd)
{
    FUZZ_CHECK(from >= 0, "%s", strerror(errno));
    FUZZ_CHECK(dup2(from, fd) == fd, "dup2 to %d: %s", fd, strerror(errno));
    close(from);
}

const char *fuzz_fd_path(int fd)
{
    static char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    return path;
}

void fuzz_close(int fd)
{
    int s = slot(fd);
    if (kinds[s] == PIPE) close(writers[s]);
    if (kinds[s] != NONE) close(fd);
    kinds[s] = NONE;
}

const char *fuzz_file(int fd, const void *bytes, size_t n)
{
    int s = slot(fd);
    if (kinds[s] != MEMFD) {
        fuzz_close(fd);
        place(memfd_create("plait-fuzz", MFD_CLOEXEC), fd);
        kinds[s] = MEMFD;
    }
    FUZZ_CHECK(ftruncate(fd, 0) == 0, "ftruncate: %s", strerror(errno));
    for (size_t done = 0; done < n;) {
        ssize_t w = pwrite(fd, (const char *)bytes + done, n - done, (off_t)done);
        FUZZ_CHECK(w > 0 || (w < 0 && errno == EINTR), "writing %s: %s", fuzz_fd_path(fd),
                   strerror(errno));
        if (w > 0) done += (size_t)w;
    }
    return fuzz_fd_path(fd);
}

const char *fuzz_fifo(int fd)
{
    int s = slot(fd), ends[2];
    fuzz_close(fd);
    FUZZ_CHECK(pipe2(ends, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
    place(ends[0], fd);
    writers[s] = ends[1];
    kinds[s] = PIPE;
    return fuzz_fd_path(fd);
}

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
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0]) tmp = access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/plait-fuzz.XXXXXX", tmp);
    FUZZ_CHECK(mkdtemp(dir), "mkdtemp %s: %s", dir, strerror(errno));
    atexit(remove_dir);
    return dir;
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
