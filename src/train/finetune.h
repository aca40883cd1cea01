/*
 * finetune: a whole LoRA fine-tuning run on one machine (train_loop.c):
 * validation split, shuffled windows per epoch, micro-batches with gradient
 * accumulation, a linear warm-up then cosine learning rate, AdamW, eval
 * loss, checkpoints every N steps, --resume, the adapter and its loss curve
 * (SVG) written at the end.
 *
 * Determinism: which windows a step sees, the dropout masks and the
 * initial adapter are functions of (seed, step) only, and the parameters
 * and AdamW moments are all the state there is, so a run resumed from a
 * checkpoint of step k continues bit-identically to one that never
 * stopped. Writes files only at the paths in the options.
 */
#ifndef CM_FINETUNE_H
#define CM_FINETUNE_H

#include "train.h"
#include "train_data.h"
#include "train_io.h"

typedef struct cm_finetune_status {
    int64_t step, steps;
    int epoch;
    float lr;
    double loss;      /* this step's mean training loss */
    double val_loss;  /* the last eval (NaN: none yet) */
    double tok_per_s; /* training tokens (inputs) per second, this run */
    double eta_s;
    int64_t n_train_win, n_val_win, n_train_tok;
    const char *saved; /* a checkpoint just written, or NULL */
} cm_finetune_status;

/* Where a run's windows and optimizer steps are computed: NULL in the
 * options is this machine (cm_train_window, cm_tadapter_adamw); a pipeline
 * of machines (cluster/train_pipe.h) is another. ad is the run's whole
 * adapter: load hands its state (after init or --resume) to wherever the
 * slices live, gather brings their parameters, moments and step back into
 * it (before a checkpoint and at the end). Errors as values with a line. */
typedef struct cm_train_exec {
    void *user;
    int (*load)(void *user, const cm_tadapter *ad, char *err, size_t errlen);
    int (*window)(void *user, const int32_t *tokens, const int32_t *target, int T, bool backward, float weight,
                  float dropout, uint64_t drop_key, double *loss, int *n_targets, char *err, size_t errlen);
    int (*step)(void *user, float lr, float beta1, float beta2, float eps, float wd, char *err, size_t errlen);
    int (*gather)(void *user, cm_tadapter *ad, char *err, size_t errlen);
    /* NULL, or: window may only queue a backward window (loss 0); flush,
     * before each step, runs the queued ones and adds their summed loss (in
     * window order) to *loss. */
    int (*flush)(void *user, double *loss, char *err, size_t errlen);
} cm_train_exec;

typedef struct cm_finetune_opts {
    int rank;                  /* default 8 */
    float alpha;               /* default 2 * rank */
    float dropout;             /* default 0 */
    unsigned targets;          /* default all seven */
    float lr;                  /* peak learning rate, default 1e-3 */
    float lr_min;              /* the cosine's floor as a fraction of lr, default 0.1 */
    int warmup;                /* steps; -1: 5% of the steps */
    float weight_decay;        /* default 0.01 */
    int batch;                 /* windows per micro-batch, default 4 */
    int grad_accum;            /* micro-batches per optimizer step, default 1 */
    int n_ctx;                 /* tokens per window, default 256 (capped at the model's context) */
    int epochs;                /* passes over the data when steps is 0; 0 (default): 3, but at least 50 steps */
    int steps;                 /* optimizer steps; 0: from epochs */
    uint64_t seed;             /* default 42 */
    float val_split;           /* fraction of examples held out, default 0.1 (0: none) */
    int eval_every;            /* steps; 0: at each checkpoint and at the end, and 10 times per run */
    int save_every;            /* steps; 0: none */
    const char *out;           /* the adapter's path; checkpoints go to OUT.ckpt-STEP.gguf, the curve to OUT.svg */
    const char *resume;        /* a checkpoint to continue from, or NULL */
    int n_threads;             /* threads for the matmuls (default 1); never changes the result */
    const cm_train_exec *exec; /* NULL: this machine; else where windows and steps run (same bits) */
    /* Called after every optimizer step (and eval); may draw a progress bar. */
    void (*progress)(void *user, const cm_finetune_status *st);
    void *progress_user;
} cm_finetune_opts;

void cm_finetune_opts_default(cm_finetune_opts *o);

/* Train on d and write the adapter (o->out) and its loss curve. m must be
 * a model cm_train_check_model accepts. */
int cm_finetune_run(const cm_model *m, const cm_tdata *d, const cm_finetune_opts *o, char *err, size_t errlen);

/* The loss curve as an SVG document: hist [n][3] = step, train loss, val
 * loss (NaN: none). Appended to out. */
void cm_finetune_svg(const float *hist, int64_t n, cm_buf *out);

#endif
