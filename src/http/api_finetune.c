/*
 * api_finetune.c: fine-tuning while serving (OpenAI's fine-tuning jobs
 * API, issue 17): POST /v1/fine_tuning/jobs starts a LoRA run through the
 * hook the program gave (cm_http_opts.finetune: the CLI trains on the
 * served model's file in the background), GET /v1/fine_tuning/jobs lists
 * the job, GET /v1/fine_tuning/jobs/ID shows it (status running,
 * succeeded or failed; fine_tuned_model: the adapter written, to load with
 * --lora), and GET /api/train gives the loss curve the dashboard draws.
 * One job at a time. The trainer only copies its progress in under ft_mu;
 * the HTTP threads read that copy, so no request ever waits on training.
 *
 * Request bodies are a client's bytes: every field is checked (a 400
 * naming it); never aborts on input.
 */
#include "http_impl.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define FT_MAX_POINTS 4096 /* beyond it, every other point is dropped (the curve keeps its shape) */

struct cm_ft_state {
    pthread_mutex_t mu;
    bool have, running;
    cm_http_ft_request req;
    long long created, finished, step, steps, tokens;
    double loss, val, tok_s;
    char status[16], adapter[512], error[512];
    float (*pts)[3]; /* step, loss, val (NaN: none) */
    int n_pts, stride;
    unsigned next_id;
};

cm_ft_state *cm_ft_new(void) {
    cm_ft_state *f = cm_calloc(1, sizeof *f);
    if (!f) return NULL;
    f->pts = cm_calloc(FT_MAX_POINTS, sizeof *f->pts);
    if (!f->pts) {
        cm_free(f);
        return NULL;
    }
    pthread_mutex_init(&f->mu, NULL);
    f->stride = 1;
    return f;
}

void cm_ft_free(cm_ft_state *f) {
    if (!f) return;
    pthread_mutex_destroy(&f->mu);
    cm_free(f->pts);
    cm_free(f);
}

void cm_http_ft_progress(cm_http_server *s, const char *id, long long step, long long steps, double loss, double val,
                         double tok_per_s, long long tokens) {
    cm_ft_state *f = cm_http_ft(s);
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    if (f->have && !strcmp(f->req.id, id)) {
        f->step = step, f->steps = steps, f->loss = loss, f->tok_s = tok_per_s, f->tokens = tokens;
        if (isfinite(val)) f->val = val;
        if (step % f->stride == 0 || isfinite(val)) {
            if (f->n_pts == FT_MAX_POINTS) { /* keep every other point, twice the stride from now on */
                for (int i = 0; i < FT_MAX_POINTS / 2; i++) memcpy(f->pts[i], f->pts[2 * i], sizeof f->pts[i]);
                f->n_pts = FT_MAX_POINTS / 2;
                f->stride *= 2;
            }
            f->pts[f->n_pts][0] = (float)step;
            f->pts[f->n_pts][1] = (float)loss;
            f->pts[f->n_pts][2] = (float)val;
            f->n_pts++;
        }
    }
    pthread_mutex_unlock(&f->mu);
}

void cm_http_ft_end(cm_http_server *s, const char *id, int rc, const char *adapter, const char *msg) {
    cm_ft_state *f = cm_http_ft(s);
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    if (f->have && !strcmp(f->req.id, id)) {
        f->running = false;
        f->finished = (long long)time(NULL);
        snprintf(f->status, sizeof f->status, "%s", rc ? "failed" : "succeeded");
        snprintf(f->adapter, sizeof f->adapter, "%s", !rc && adapter ? adapter : "");
        snprintf(f->error, sizeof f->error, "%s", rc && msg ? msg : "");
    }
    pthread_mutex_unlock(&f->mu);
}

static void num(cm_buf *b, double v) {
    if (isfinite(v)) cm_buf_printf(b, "%.6g", v);
    else cm_buf_puts(b, "null");
}

/* The job as OpenAI's fine_tuning.job object (f->mu held). */
static void job_json(cm_http_server *srv, const cm_ft_state *f, cm_buf *b) {
    const cm_http_ft_request *r = &f->req;
    cm_buf_printf(b, "{\"id\":\"%s\",\"object\":\"fine_tuning.job\",\"model\":", r->id);
    cm_json_str(b, cm_http_model_id(srv), strlen(cm_http_model_id(srv)));
    cm_buf_printf(b, ",\"created_at\":%lld,\"finished_at\":", f->created);
    if (f->running) cm_buf_puts(b, "null");
    else cm_buf_printf(b, "%lld", f->finished);
    cm_buf_printf(b, ",\"status\":\"%s\",\"training_file\":", f->status);
    cm_json_str(b, r->training_file, strlen(r->training_file));
    cm_buf_puts(b, ",\"validation_file\":null,\"fine_tuned_model\":");
    if (f->adapter[0]) cm_json_str(b, f->adapter, strlen(f->adapter));
    else cm_buf_puts(b, "null");
    cm_buf_puts(b, ",\"hyperparameters\":{\"n_epochs\":");
    if (r->n_epochs) cm_buf_printf(b, "%d", r->n_epochs);
    else cm_buf_puts(b, "\"auto\"");
    cm_buf_puts(b, ",\"batch_size\":");
    if (r->batch_size) cm_buf_printf(b, "%d", r->batch_size);
    else cm_buf_puts(b, "\"auto\"");
    cm_buf_puts(b, ",\"learning_rate_multiplier\":");
    if (r->lr_multiplier > 0) num(b, r->lr_multiplier);
    else cm_buf_puts(b, "\"auto\"");
    cm_buf_printf(b, "},\"trained_tokens\":%lld,\"result_files\":[],\"error\":", f->running ? 0 : f->tokens);
    if (f->error[0]) {
        cm_buf_puts(b, "{\"code\":\"training_failed\",\"message\":");
        cm_json_str(b, f->error, strlen(f->error));
        cm_buf_puts(b, ",\"param\":null}");
    } else cm_buf_puts(b, "null");
    cm_buf_printf(b, ",\"cumulo\":{\"step\":%lld,\"steps\":%lld,\"loss\":", f->step, f->steps);
    num(b, f->step ? f->loss : NAN);
    cm_buf_puts(b, ",\"val_loss\":");
    num(b, f->step ? f->val : NAN);
    cm_buf_puts(b, ",\"tokens_per_s\":");
    num(b, f->tok_s);
    cm_buf_puts(b, "}}");
}

/* o[key]: an integer in [lo, hi] or absent/null/"auto" (0). */
static bool get_int(const cJSON *o, const char *key, int lo, int hi, int *out, api_error *ae) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = 0;
    if (cm_api_is_null(x) || (cJSON_IsString(x) && !strcmp(x->valuestring, "auto"))) return true;
    if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < lo || x->valuedouble > hi) {
        cm_api_error_set(ae, 400, "invalid_request_error", key, NULL,
                         "'%s' must be \"auto\" or an integer from %d to %d", key, lo, hi);
        return false;
    }
    *out = (int)x->valuedouble;
    return true;
}

static int create(cm_http_server *srv, const char *body, size_t n, cm_buf *out, api_error *ae) {
    const cm_http_opts *o = cm_http_options(srv);
    cm_ft_state *f = cm_http_ft(srv);
    if (!o->finetune || !f) {
        cm_api_error_set(ae, 404, "invalid_request_error", NULL, "not_found",
                         "fine-tuning is not enabled on this server (start it with --finetune-dir DIR)");
        return -1;
    }
    cJSON *root = cJSON_ParseWithLength(body, n);
    cm_http_ft_request r = {0};
    int rc = -1;
    const cJSON *tf = root ? cJSON_GetObjectItemCaseSensitive(root, "training_file") : NULL;
    const cJSON *hp = root ? cJSON_GetObjectItemCaseSensitive(root, "hyperparameters") : NULL;
    const cJSON *sx = root ? cJSON_GetObjectItemCaseSensitive(root, "suffix") : NULL;
    const cJSON *model = root ? cJSON_GetObjectItemCaseSensitive(root, "model") : NULL;
    if (!root || !cJSON_IsObject(root))
        cm_api_error_set(ae, 400, "invalid_request_error", NULL, NULL, "the request body must be a JSON object");
    else if (!cJSON_IsString(tf) || !tf->valuestring[0] || strlen(tf->valuestring) >= sizeof r.training_file)
        cm_api_error_set(ae, 400, "invalid_request_error", "training_file", NULL,
                         "'training_file' must be the name of a JSONL file in the server's fine-tuning directory");
    else if (!cm_api_is_null(model) && (!cJSON_IsString(model) || strcmp(model->valuestring, cm_http_model_id(srv))))
        cm_api_error_set(ae, 400, "invalid_request_error", "model", NULL,
                         "'model' must be '%.200s': this server fine-tunes the model it serves", cm_http_model_id(srv));
    else if (!cm_api_is_null(hp) && !cJSON_IsObject(hp))
        cm_api_error_set(ae, 400, "invalid_request_error", "hyperparameters", NULL,
                         "'hyperparameters' must be an object");
    else if (!cm_api_is_null(sx) && (!cJSON_IsString(sx) || strlen(sx->valuestring) >= sizeof r.suffix))
        cm_api_error_set(ae, 400, "invalid_request_error", "suffix", NULL,
                         "'suffix' must be a string of at most %d bytes", (int)sizeof r.suffix - 1);
    else {
        snprintf(r.training_file, sizeof r.training_file, "%s", tf->valuestring);
        if (cJSON_IsString(sx)) snprintf(r.suffix, sizeof r.suffix, "%s", sx->valuestring);
        const cJSON *lr = cJSON_IsObject(hp) ? cJSON_GetObjectItemCaseSensitive(hp, "learning_rate_multiplier") : NULL;
        bool ok = get_int(hp, "n_epochs", 1, 1000, &r.n_epochs, ae) &&
                  get_int(hp, "batch_size", 1, 256, &r.batch_size, ae) &&
                  get_int(root, "steps", 1, 1000000, &r.steps, ae) && get_int(root, "rank", 1, 256, &r.rank, ae) &&
                  get_int(root, "n_ctx", 8, 1 << 16, &r.n_ctx, ae);
        if (ok && !cm_api_is_null(lr) && !(cJSON_IsString(lr) && !strcmp(lr->valuestring, "auto"))) {
            if (!cJSON_IsNumber(lr) || !(lr->valuedouble > 0 && lr->valuedouble <= 100)) {
                cm_api_error_set(ae, 400, "invalid_request_error", "learning_rate_multiplier", NULL,
                                 "'learning_rate_multiplier' must be \"auto\" or a number above 0 and at most 100");
                ok = false;
            } else r.lr_multiplier = lr->valuedouble;
        }
        if (ok) {
            pthread_mutex_lock(&f->mu);
            if (f->running) {
                cm_api_error_set(ae, 409, "invalid_request_error", NULL, "job_running",
                                 "fine-tuning job %s is still running: one job at a time", f->req.id);
                pthread_mutex_unlock(&f->mu);
            } else {
                snprintf(r.id, sizeof r.id, "ftjob-%u", ++f->next_id);
                char err[400] = "";
                /* under f->mu: a second request waits, then sees it running */
                if (o->finetune(o->finetune_user, &r, err, sizeof err)) {
                    cm_api_error_set(ae, 400, "invalid_request_error", "training_file", NULL, "%s", err);
                } else {
                    f->have = f->running = true;
                    f->req = r;
                    f->created = (long long)time(NULL);
                    f->step = f->steps = f->tokens = 0;
                    f->loss = f->val = f->tok_s = NAN;
                    f->n_pts = 0;
                    f->stride = 1;
                    f->adapter[0] = f->error[0] = 0;
                    snprintf(f->status, sizeof f->status, "running");
                    job_json(srv, f, out);
                    rc = 0;
                }
                pthread_mutex_unlock(&f->mu);
            }
        }
    }
    cJSON_Delete(root);
    return rc;
}

int cm_api_finetune(cm_http_server *srv, const char *method, const char *url, const char *body, size_t n, cm_buf *out,
                    api_error *ae) {
    cm_ft_state *f = cm_http_ft(srv);
    const bool post = !strcmp(method, "POST");
    if (!strcmp(url, "/api/train")) { /* the dashboard's curve */
        if (!f) {
            cm_buf_puts(out, "{\"job\":null,\"points\":[]}");
            return 0;
        }
        pthread_mutex_lock(&f->mu);
        cm_buf_puts(out, "{\"job\":");
        if (f->have) job_json(srv, f, out);
        else cm_buf_puts(out, "null");
        cm_buf_puts(out, ",\"points\":[");
        for (int i = 0; i < f->n_pts; i++) {
            cm_buf_printf(out, "%s[%.0f,", i ? "," : "", (double)f->pts[i][0]);
            num(out, f->pts[i][1]);
            cm_buf_puts(out, ",");
            num(out, f->pts[i][2]);
            cm_buf_puts(out, "]");
        }
        cm_buf_puts(out, "]}");
        pthread_mutex_unlock(&f->mu);
        return 0;
    }
    if (!strcmp(url, "/v1/fine_tuning/jobs")) {
        if (post) return create(srv, body, n, out, ae);
        cm_buf_puts(out, "{\"object\":\"list\",\"data\":[");
        if (f) {
            pthread_mutex_lock(&f->mu);
            if (f->have) job_json(srv, f, out);
            pthread_mutex_unlock(&f->mu);
        }
        cm_buf_puts(out, "],\"has_more\":false}");
        return 0;
    }
    const char *id = url + strlen("/v1/fine_tuning/jobs/"); /* the route: that prefix */
    if (post) {
        cm_api_error_set(ae, 405, "invalid_request_error", NULL, "method_not_allowed",
                         "POST is not allowed here; use GET");
        return -1;
    }
    if (f) pthread_mutex_lock(&f->mu);
    bool found = f && f->have && !strcmp(f->req.id, id);
    if (found) job_json(srv, f, out);
    if (f) pthread_mutex_unlock(&f->mu);
    if (!found) {
        cm_api_error_set(ae, 404, "invalid_request_error", "fine_tuning_job_id", "not_found",
                         "no fine-tuning job '%.100s'", id);
        return -1;
    }
    return 0;
}
