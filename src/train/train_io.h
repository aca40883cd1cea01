/*
 * train_io: the files of a fine-tuning run. The adapter is llama.cpp's LoRA
 * GGUF (general.type "adapter", adapter.type "lora", adapter.lora.alpha,
 * blk.N.<target>.weight.lora_a [n_in, rank] and .lora_b [rank, n_out] in
 * F32), which model/lora.h and llama.cpp load. A checkpoint is a GGUF of its
 * own (general.type "cumulo-finetune-checkpoint") holding the whole
 * parameter vector, both AdamW moments, the optimizer step, the run's shape
 * (rank, alpha, targets, seed, data size) to check a --resume against, and
 * the loss history; it is never an adapter.
 */
#ifndef CM_TRAIN_IO_H
#define CM_TRAIN_IO_H

#include "../gguf/gguf.h"
#include "train.h"

/* Write the adapter to path atomically (path NULL: append the file to out). */
int cm_tadapter_write(const cm_tadapter *ad, const char *path, cm_buf *out, char *err, size_t errlen);

/* What a checkpoint records beside the adapter's vectors. */
typedef struct cm_train_ckpt {
    uint64_t seed;    /* the run's --seed */
    uint64_t data_id; /* a hash of the training windows: a resume on other data is refused */
    int64_t n_hist;   /* loss history entries: [n_hist][3] = step, train loss, val loss (NaN: none) */
    float *hist;
} cm_train_ckpt;

int cm_train_ckpt_save(const cm_tadapter *ad, const cm_train_ckpt *c, const char *path, char *err, size_t errlen);
/* Load into ad (made with the same model, rank, alpha, targets): params,
 * moments and step; c->hist is allocated (cm_free). CM_EINVAL with one line
 * when the checkpoint belongs to another run shape. */
int cm_train_ckpt_load(cm_tadapter *ad, cm_train_ckpt *c, const char *path, char *err, size_t errlen);

#endif
