/* gpt2.c — GPT-2 initialisation and llm.c checkpoint reading (model FLOPs are
 * common/place/gpu.c's; the layout is common/gpt2/gpt2_layout.c). Writing checkpoints (with their
 * manifests) is ckpt.c's. */
#include "runtime/gpt2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/crc32c.h"
#include "common/fsutil.h"
#include "common/formats/llmc.h"
#include "common/rng.h"

void gpt2_init_weights(const struct gpt2_config *cfg, const struct gpt2_layout *layout,
                       float *params, uint64_t seed)
{
    memset(params, 0, layout->total * sizeof(float));
    /* GPT-2 scales its residual projections by 1/sqrt(2L); transformers'
     * Llama draws every matrix with initializer_range 0.02 */
    double residual_std = cfg->llama ? 0.02 : 0.02 / sqrt(2.0 * cfg->layers);
    for (int t = 0; t < GPT2_TENSORS; t++) {
        float *p = params + layout->offset[t];
        size_t n = layout->elems[t];
        if (t == GPT2_LN1W || t == GPT2_LN2W || t == GPT2_LNFW) {
            for (size_t i = 0; i < n; i++) p[i] = 1.0f;
            continue;
        }
        if (!gpt2_tensor_decays(t)) continue; /* biases stay zero */
        double std = (t == GPT2_ATTPROJW || t == GPT2_FCPROJW) ? residual_std : 0.02;
        if (t == GPT2_WTE || t == GPT2_LMHEAD) /* padded rows stay zero */
            n = n ? (size_t)cfg->vocab * cfg->hidden : 0;
        struct rng r;
        rng_seed(&r, seed, (uint64_t)t + 1); /* one stream per tensor */
        for (size_t i = 0; i < n; i++) p[i] = (float)(std * rng_normal(&r));
    }
}

int gpt2_read_llmc(const char *path, const struct gpt2_config *cfg, float *params, uint32_t *crc,
                   struct plait_error *err)
{
    struct llmc_model_header h;
    if (llmc_read_model_header(path, &h, err)) return -1;
    struct gpt2_config file = llmc_model_config(&h);
    if (!gpt2_config_same_tensors(&file, cfg) || h.vocab != cfg->vocab)
        return error_set(err,
                         "%s: model is maxT %d V %d Vp %d L %d NH %d C %d, the plan wants maxT "
                         "%d V %d Vp %d L %d NH %d C %d",
                         path, h.max_seq_len, h.vocab, h.padded_vocab, h.layers, h.heads, h.hidden,
                         cfg->max_seq_len, cfg->vocab, cfg->padded_vocab, cfg->layers, cfg->heads,
                         cfg->hidden);
    struct gpt2_layout layout;
    gpt2_layout(cfg, &layout);
    FILE *f = fs_fopen_regular(path, err);
    if (!f) return -1;
    int32_t header[LLMC_HEADER_INTS];
    int rc = -1;
    uint16_t *buf16 = NULL;
    if (fread(header, 4, LLMC_HEADER_INTS, f) != LLMC_HEADER_INTS) {
        error_set(err, "%s: short read of the header", path);
        goto out;
    }
    uint32_t c = crc32c_update(0, header, sizeof header);
    if (h.version != LLMC_MODEL_VERSION_BF16) {
        if (fread(params, sizeof(float), layout.total, f) != layout.total) {
            error_set(err, "%s: short read of the parameters", path);
            goto out;
        }
        c = crc32c_update(c, params, layout.total * sizeof(float));
    } else { /* bf16: widen in chunks */
        enum { CHUNK = 1 << 20 };
        buf16 = malloc(CHUNK * sizeof(uint16_t));
        if (!buf16) {
            error_set(err, "%s: out of memory", path);
            goto out;
        }
        for (size_t done = 0; done < layout.total;) {
            size_t n = layout.total - done < CHUNK ? layout.total - done : CHUNK;
            if (fread(buf16, sizeof(uint16_t), n, f) != n) {
                error_set(err, "%s: short read of the parameters", path);
                goto out;
            }
            c = crc32c_update(c, buf16, n * sizeof(uint16_t));
            for (size_t i = 0; i < n; i++) {
                uint32_t bits = (uint32_t)buf16[i] << 16;
                memcpy(&params[done + i], &bits, sizeof bits);
            }
            done += n;
        }
    }
    if (crc) *crc = c;
    rc = 0;
out:
    free(buf16);
    fclose(f);
    return rc;
}
