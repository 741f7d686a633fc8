/* tensorboard.c — TensorBoard event files (tensorboard.h): the record
 * framing and the few protocol-buffer fields a scalar needs, encoded here. */
#include "common/formats/tensorboard.h"

#include <errno.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/crc32c.h"
#include "common/fsutil.h"

/* a protocol buffer being written: at most one small record */
struct pb {
    uint8_t b[512];
    size_t n;
    bool overflow;
};

static void put_byte(struct pb *p, uint8_t x)
{
    if (p->n < sizeof p->b)
        p->b[p->n++] = x;
    else
        p->overflow = true;
}

static void put_varint(struct pb *p, uint64_t v)
{
    do {
        put_byte(p, (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
        v >>= 7;
    } while (v);
}

static void put_key(struct pb *p, int field, int wire)
{
    put_varint(p, (uint64_t)field << 3 | (uint64_t)wire);
}

static void put_fixed(struct pb *p, const void *le, size_t bytes)
{
    for (size_t i = 0; i < bytes; i++) put_byte(p, ((const uint8_t *)le)[i]);
}

static void put_double(struct pb *p, int field, double x)
{
    put_key(p, field, 1);
    put_fixed(p, &x, 8); /* x86-64 and every plait target: little-endian */
}

static void put_bytes(struct pb *p, int field, const void *data, size_t bytes)
{
    put_key(p, field, 2);
    put_varint(p, bytes);
    put_fixed(p, data, bytes);
}

static uint32_t masked_crc(const void *data, size_t bytes)
{
    uint32_t c = crc32c_update(0, data, bytes);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static double wall_time(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec / 1e6;
}

/* One record of the event e (its fields after wall_time and step). */
static int write_event(struct tensorboard *tb, int64_t step, const struct pb *fields,
                       struct plait_error *err)
{
    struct pb e = {0};
    put_double(&e, 1, wall_time());
    if (step) {
        put_key(&e, 2, 0);
        put_varint(&e, (uint64_t)step);
    }
    put_fixed(&e, fields->b, fields->n);
    if (e.overflow || fields->overflow) return error_set(err, "%s: a record too long", tb->path);
    uint64_t len = e.n;
    uint32_t len_crc = masked_crc(&len, 8), data_crc = masked_crc(e.b, e.n);
    if (fwrite(&len, 8, 1, tb->f) != 1 || fwrite(&len_crc, 4, 1, tb->f) != 1 ||
        fwrite(e.b, 1, e.n, tb->f) != e.n || fwrite(&data_crc, 4, 1, tb->f) != 1 ||
        fflush(tb->f))
        return error_errno(err, "writing %s", tb->path);
    return 0;
}

int tensorboard_open(struct tensorboard *tb, const char *dir, int64_t resumed_step,
                     struct plait_error *err)
{
    memset(tb, 0, sizeof *tb);
    char host[256] = "localhost", name[320];
    gethostname(host, sizeof host - 1);
    snprintf(name, sizeof name, "events.out.tfevents.%lld.%s", (long long)wall_time(), host);
    if (fs_mkdir_p(dir, err) || fs_join(tb->path, sizeof tb->path, dir, name, err)) return -1;
    /* a second run in the same second gets its own file */
    for (int i = 1; access(tb->path, F_OK) == 0; i++) {
        char again[340];
        snprintf(again, sizeof again, "%s.%d", name, i);
        if (fs_join(tb->path, sizeof tb->path, dir, again, err)) return -1;
    }
    if (!(tb->f = fopen(tb->path, "wbx"))) return error_errno(err, "creating %s", tb->path);
    struct pb version = {0};
    put_bytes(&version, 3, "brain.Event:2", strlen("brain.Event:2"));
    if (write_event(tb, 0, &version, err)) return -1;
    if (!resumed_step) return 0;
    struct pb start = {0}, log = {0};
    put_key(&log, 1, 0);
    put_varint(&log, 1); /* SessionLog.START */
    put_bytes(&start, 7, log.b, log.n);
    return write_event(tb, resumed_step + 1, &start, err);
}

int tensorboard_scalar(struct tensorboard *tb, const char *tag, int64_t step, double value,
                       struct plait_error *err)
{
    if (!tb->f) return 0;
    struct pb v = {0}, summary = {0};
    put_bytes(&v, 1, tag, strlen(tag));
    float x = (float)value;
    put_key(&v, 2, 5);
    put_fixed(&v, &x, 4);
    put_bytes(&summary, 1, v.b, v.n);
    struct pb fields = {0};
    put_bytes(&fields, 5, summary.b, summary.n);
    return write_event(tb, step, &fields, err);
}

void tensorboard_close(struct tensorboard *tb)
{
    if (tb->f) fclose(tb->f);
    tb->f = NULL;
}
