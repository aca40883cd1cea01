/*
 * config.c: the process environment, read once, in one place. Every
 * variable cumulo reads is in the table below (name, default, meaning) and
 * nowhere else: the rest of the program asks cm_config_get() for the parsed
 * value and never calls getenv(). docs/DESIGN.md ("Configuration") carries
 * the same table for users; tests/unit/test_base.c checks that every name
 * here is there.
 *
 * The environment is read at the first cm_config_get() (thread-safe) and
 * again only by cm_config_reload(), which tests that setenv() mid-run call
 * (and `cumulo bench --isa`, before any thread starts); a reload publishes a
 * new copy, so threads reading the old one meanwhile are not disturbed. Never parse anything
 * here that needs another module: values that need more than a number or a
 * string are kept as strings for the module that owns their meaning.
 */
#include "base.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* X(field, NAME, default, meaning): every variable, in one table. */
#define CM_CONFIG_VARS(X)                                                                                          \
    X(log, "CUMULO_LOG", "warning", "log level: error, warning, info or debug")                                    \
    X(isa, "CUMULO_ISA", "best",                                                                                   \
      "caps the kernels' instruction set (scalar, avx2, avx512, neon; best: what the CPU "                         \
      "has)")                                                                                                      \
    X(mmap, "CUMULO_MMAP", "unset",                                                                                \
      "set and not 0: keep weights in the file mapping instead of reading them into "                              \
      "memory (as --mmap)")                                                                                        \
    X(repack, "CUMULO_REPACK", "unset", "0: no repacking of weights into the kernels' interleaved layouts")        \
    X(amx, "CUMULO_AMX", "1", "0: the int8 prefill gemms do not use AMX tiles where the CPU has them")             \
    X(tune, "CUMULO_TUNE", "1",                                                                                    \
      "0: the kernels' built-in knob values; force: measure them again at model load even when cached")            \
    X(tune_dir, "CUMULO_TUNE_DIR", "$XDG_CACHE_HOME/cumulo/tune, else $HOME/.cache/cumulo/tune",                   \
      "where the kernels' knob values chosen at load are kept, one file per CPU signature")                        \
    X(key_file, "CUMULO_KEY_FILE", "$HOME/.config/cumulo/cluster.key", "the cluster key file (as --key-file)")     \
    X(models, "CUMULO_MODELS", "$XDG_CACHE_HOME/cumulo/models, else $HOME/.cache/cumulo/models",                   \
      "the models directory of pull, models, rm and hf:// names")                                                  \
    X(api_key, "CUMULO_API_KEY", "unset", "serve: the bearer key every API request must carry (as --api-key)")     \
    X(progress, "CUMULO_PROGRESS", "on when stderr is a terminal", "0: no progress bars; non-zero: always")        \
    X(host_id, "CUMULO_HOST_ID", "the machine id and host name",                                                   \
      "this machine's host id in HELLO (tests: processes "                                                         \
      "of one machine play separate machines)")                                                                    \
    X(declare_speed, "CUMULO_DECLARE_SPEED", "measured",                                                           \
      "GFLOPS,GBS: the speeds this process declares instead of "                                                   \
      "measuring them (equally strong nodes on one host)")                                                         \
    X(mem_offer, "CUMULO_MEM_OFFER", "free memory",                                                                \
      "bytes (K/M/G suffix): caps the memory this process offers the "                                             \
      "planner")                                                                                                   \
    X(lost_ms, "CUMULO_LOST_MS", "2000 (CM_PIPE_LOST_MS)",                                                         \
      "a node silent this long is lost; also bounds sends and "                                                    \
      "all-reduce waits (>= 200; on every process)")                                                               \
    X(token_timeout_ms, "CUMULO_TOKEN_TIMEOUT_MS", "60000 (CM_PIPE_DATA_MS)",                                      \
      "coordinator: the deadline for a "                                                                           \
      "sampled token (>= 200)")                                                                                    \
    X(rejoin_ms, "CUMULO_REJOIN_MS", "5000 (CM_PIPE_REJOIN_MS)",                                                   \
      "coordinator: how often idle upkeep redials lost "                                                           \
      "and new nodes (>= 100)")                                                                                    \
    X(prefill_chunk, "CUMULO_PREFILL_CHUNK", "32", "serve: prompt tokens evaluated per step while others decode")  \
    X(pipe_groups, "CUMULO_PIPE_GROUPS", "0 (one per host the stages run on)",                                     \
      "pipeline: micro-batches the decode rows of a step are split into, each "                                    \
      "relaunched as soon as its tokens return")                                                                   \
    X(tp_trace, "CUMULO_TP_TRACE", "unset",                                                                        \
      "set and not 0: tensor-parallel members print where their time went (bench/tp_ratio.sh)")                    \
    X(tp_spin_us, "CUMULO_TP_SPIN_US", "50 on loopback links, else 0",                                             \
      "tensor parallel: how long a receive spins before it sleeps")                                                \
    X(tp_head_split, "CUMULO_TP_HEAD_SPLIT", "1", "0: rank 0 of a tensor-parallel group computes the whole head")  \
    X(tp_encrypt_loopback, "CUMULO_TP_ENCRYPT_LOOPBACK", "unset",                                                  \
      "set and not 0: all-reduce pieces on loopback links are encrypted too (by default only authenticated)")      \
    X(tp_shm, "CUMULO_TP_SHM", "1",                                                                                \
      "0: tensor-parallel members on one host send all-reduce pieces over their loopback link, not shared memory") \
    X(mixed_pass, "CUMULO_MIXED_PASS", "1",                                                                        \
      "serve: 0 evaluates prompt chunks in passes of their own, not with the "                                     \
      "decode rows")                                                                                               \
    X(powercap_root, "CUMULO_POWERCAP_ROOT", "/sys/class/powercap", "where the RAPL energy counters are (tests)")  \
    X(proc_stat, "CUMULO_PROC_STAT", "/proc/stat", "where the CPU time counters are (tests)")                      \
    X(oracle_dir, "CUMULO_ORACLE_DIR", "/tmp/nlc", "bench: the node-llama-cpp folder of the reference runs")       \
    X(llamacpp_bench, "CUMULO_LLAMACPP_BENCH", "unset", "bench: a native llama-bench binary to compare with")      \
    X(service_root, "CUMULO_SERVICE_ROOT", "\"\"", "service: write unit files under this root (tests)")            \
    X(service_kind, "CUMULO_SERVICE_KIND", "this system's", "service: launchd or systemd files (tests)")           \
    X(test_no_recover, "CUMULO_TEST_NO_RECOVER", "unset", "test hook: set, a coordinator refuses to recover")      \
    X(test_cluster_delay_ms, "CUMULO_TEST_CLUSTER_DELAY_MS", "0",                                                  \
      "test hook: a pause after each micro-batch sent "                                                            \
      "to a cluster")                                                                                              \
    X(test_step_delay_ms, "CUMULO_TEST_STEP_DELAY_MS", "0", "test hook: serve pauses this long after each step")   \
    X(test_layer_delay_ms, "CUMULO_TEST_LAYER_DELAY_MS", "0",                                                      \
      "test hook: serve pauses this long between two layers of a pass")                                            \
    X(interject, "CUMULO_INTERJECT", "1", "serve: 0 lets no short prompt run between two layers of a pass")        \
    X(serve_trace, "CUMULO_SERVE_TRACE", "unset",                                                                  \
      "set and not 0: serve prints a line per scheduler pass, admission, interjection and first token "            \
      "(where a time to first token went)")                                                                        \
    X(test_dash_hold_ms, "CUMULO_TEST_DASH_HOLD_MS", "0",                                                          \
      "test hook: `finetune --dashboard` keeps the page up this long after the run")                               \
    X(test_sockbuf, "CUMULO_TEST_SOCKBUF", "0 (the system's)",                                                     \
      "test hook: socket buffer bytes, so a frozen peer "                                                          \
      "blocks its senders soon")                                                                                   \
    X(gpu, "CUMULO_GPU", "unset",                                                                                  \
      "the --gpu choice when the option is not given: auto, vulkan, none or a device "                             \
      "number (the test suites' switch)")                                                                          \
    X(test_open_fail, "CUMULO_TEST_OPEN_FAIL", "unset",                                                            \
      "test hook: exit or stop: a node exits (or stops itself, SIGSTOP) when its first ASSIGN arrives, "           \
      "as if lost while the cluster opens")                                                                        \
    X(test_gpu_fault, "CUMULO_TEST_GPU_FAULT", "unset",                                                            \
      "test hook: lost or oom, or lost:N / oom:N: the device's Nth forward pass (from 1) fails so "                \
      "(lost: every later one too)")                                                                               \
    X(gpu_subgroup, "CUMULO_GPU_SUBGROUP", "1",                                                                    \
      "0: the GPU's matmuls reduce through shared memory even where the device has subgroup arithmetic")           \
    X(vulkan_lib, "CUMULO_VULKAN_LIB", "libvulkan.so.1 (macOS: libvulkan.1.dylib, MoltenVK)",                      \
      "the Vulkan loader "                                                                                         \
      "to open")                                                                                                   \
    X(mpi_spin_ms, "CUMULO_MPI_SPIN_MS", "5 (OpenMPI), 0 (MPICH)",                                                 \
      "cumulo mpi: how long the link bridge polls "                                                                \
      "without sleeping after traffic")                                                                            \
    X(mpi_nap_us, "CUMULO_MPI_NAP_US", "50",                                                                       \
      "cumulo mpi: then, for 100 ms, the bridge naps this long between polls "                                     \
      "(0: sleeps 1 ms at once)")                                                                                  \
    X(tmpdir, "TMPDIR", "/tmp", "cumulo mpi: where the link bridge's sockets go (paths under 48 bytes)")           \
    X(home, "HOME", "(the system's)", "home: default key file, node cache, models and tune directories, services") \
    X(xdg_cache_home, "XDG_CACHE_HOME", "unset", "the models and tune directories' parent when set")               \
    X(xdg_config_home, "XDG_CONFIG_HOME", "unset", "service --user: the systemd unit's folder when set")           \
    X(sudo_user, "SUDO_USER", "unset", "service: the user a system service runs as when installed with sudo")      \
    X(path, "PATH", "(the system's)", "where this program finds its own file when argv[0] has no slash")           \
    X(hf_endpoint, "HF_ENDPOINT", "https://huggingface.co", "pull: the Hugging Face hub to download from")         \
    X(hf_token, "HF_TOKEN", "unset", "pull: the bearer token for gated or private repositories")

enum {
#define X(f, name, def, what) CV_##f,
    CM_CONFIG_VARS(X)
#undef X
        CV_COUNT
};

static const cm_config_var k_vars[CV_COUNT] = {
#define X(f, name, def, what) {name, def, what},
    CM_CONFIG_VARS(X)
#undef X
};

/* A reload fills the next of a few slots and then publishes it (g_cur), so
 * a thread reading the configuration meanwhile (any thread may log) keeps
 * a consistent copy: a slot is rewritten only SLOTS reloads later. */
#define SLOTS 4
static cm_config g_slot[SLOTS];
static char *g_raw[SLOTS][CV_COUNT]; /* owned copies of the values (NULL: unset) */
static int g_next;                   /* the slot the next load fills (under g_mu) */
static _Atomic(cm_config *) g_cur;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

const cm_config_var *cm_config_vars(int *n) {
    *n = CV_COUNT;
    return k_vars;
}

/* The value, or NULL when unset or empty (empty counts as unset). */
static const char *set(const char *s) { return s && *s ? s : NULL; }

/* An integer value when it is one and at least min; else 0 (unset). */
static int int_at_least(const char *s, int min) { return s && atoi(s) >= min ? atoi(s) : 0; }

static void load(void) {
    pthread_mutex_lock(&g_mu);
    const int k = g_next;
    g_next = (g_next + 1) % SLOTS;
    char **raw = g_raw[k];
    for (int i = 0; i < CV_COUNT; i++) {
        free(raw[i]);
        const char *v = getenv(k_vars[i].name);
        raw[i] = v ? strdup(v) : NULL;
    }
    cm_config *c = &g_slot[k];
    memset(c, 0, sizeof *c);
#define RAW(f) ((const char *)raw[CV_##f])
#define STR(f) set(RAW(f))
    const char *lv = RAW(log);
    c->log_level = !lv                    ? CM_LOG_WARN
                   : !strcmp(lv, "error") ? CM_LOG_ERROR
                   : !strcmp(lv, "info")  ? CM_LOG_INFO
                   : !strcmp(lv, "debug") ? CM_LOG_DEBUG
                                          : CM_LOG_WARN;
    c->isa = STR(isa) ? STR(isa) : "best";
    const char *mm = STR(mmap);
    c->mmap = mm && strcmp(mm, "0") != 0;
    c->repack_off = RAW(repack) && !strcmp(RAW(repack), "0");
    c->amx_off = RAW(amx) && !strcmp(RAW(amx), "0");
    c->tune_off = RAW(tune) && !strcmp(RAW(tune), "0");
    c->tune_force = RAW(tune) && !strcmp(RAW(tune), "force");
    c->tune_dir = STR(tune_dir);
    c->key_file = STR(key_file);
    c->models = STR(models);
    c->api_key = RAW(api_key);
    c->progress = RAW(progress) ? atoi(RAW(progress)) != 0 : -1;
    c->host_id = STR(host_id);
    c->declare_speed = STR(declare_speed);
    c->mem_offer = -1;
    if (STR(mem_offer)) { /* bytes, or with a K/M/G suffix */
        const char *s = STR(mem_offer);
        char *end;
        unsigned long long v = strtoull(s, &end, 10);
        int shift = *end == 'K' || *end == 'k'   ? 10
                    : *end == 'M' || *end == 'm' ? 20
                    : *end == 'G' || *end == 'g' ? 30
                                                 : 0;
        if (end != s && v < (1ull << 44) && (v << shift) >> shift == v) c->mem_offer = (int64_t)(v << shift);
    }
    c->lost_ms = int_at_least(RAW(lost_ms), 200);
    c->token_timeout_ms = int_at_least(RAW(token_timeout_ms), 200);
    c->rejoin_ms = int_at_least(RAW(rejoin_ms), 100);
    c->prefill_chunk = int_at_least(RAW(prefill_chunk), 1);
    if (!c->prefill_chunk) c->prefill_chunk = 32;
    c->pipe_groups = int_at_least(RAW(pipe_groups), 1);
    c->tp_trace = RAW(tp_trace) && *RAW(tp_trace) && strcmp(RAW(tp_trace), "0") != 0;
    c->tp_spin_us = STR(tp_spin_us) ? (atoi(STR(tp_spin_us)) > 0 ? atoi(STR(tp_spin_us)) : 0) : -1;
    c->tp_head_split_off = RAW(tp_head_split) && !strcmp(RAW(tp_head_split), "0");
    c->tp_encrypt_loopback =
        RAW(tp_encrypt_loopback) && *RAW(tp_encrypt_loopback) && strcmp(RAW(tp_encrypt_loopback), "0") != 0;
    c->tp_shm_off = RAW(tp_shm) && !strcmp(RAW(tp_shm), "0");
    c->mixed_pass = !RAW(mixed_pass) || strcmp(RAW(mixed_pass), "0") != 0;
    c->gpu_subgroup = !RAW(gpu_subgroup) || strcmp(RAW(gpu_subgroup), "0") != 0;
    c->powercap_root = STR(powercap_root) ? STR(powercap_root) : "/sys/class/powercap";
    c->proc_stat = STR(proc_stat) ? STR(proc_stat) : "/proc/stat";
    c->oracle_dir = STR(oracle_dir) ? STR(oracle_dir) : "/tmp/nlc";
    c->llamacpp_bench = STR(llamacpp_bench);
    c->service_root = RAW(service_root) ? RAW(service_root) : "";
    c->service_kind = STR(service_kind);
    c->test_no_recover = RAW(test_no_recover) != NULL;
    c->test_cluster_delay_ms = RAW(test_cluster_delay_ms) ? (unsigned)atoi(RAW(test_cluster_delay_ms)) : 0;
    c->test_step_delay_ms = RAW(test_step_delay_ms) ? (unsigned)atoi(RAW(test_step_delay_ms)) : 0;
    c->test_layer_delay_ms = RAW(test_layer_delay_ms) ? (unsigned)atoi(RAW(test_layer_delay_ms)) : 0;
    c->interject = !RAW(interject) || strcmp(RAW(interject), "0") != 0;
    c->serve_trace = RAW(serve_trace) && *RAW(serve_trace) && strcmp(RAW(serve_trace), "0") != 0;
    c->test_dash_hold_ms = RAW(test_dash_hold_ms) ? (unsigned)atoi(RAW(test_dash_hold_ms)) : 0;
    c->test_sockbuf = int_at_least(RAW(test_sockbuf), 1);
    c->gpu = STR(gpu);
    c->vulkan_lib = STR(vulkan_lib);
    c->test_gpu_fault = STR(test_gpu_fault);
    c->test_open_fail = STR(test_open_fail);
    c->mpi_spin_ms = STR(mpi_spin_ms);
    c->mpi_nap_us = STR(mpi_nap_us);
    c->tmpdir = STR(tmpdir);
    c->home = STR(home);
    c->xdg_cache_home = STR(xdg_cache_home);
    c->xdg_config_home = STR(xdg_config_home);
    c->sudo_user = STR(sudo_user);
    c->path = RAW(path);
    c->hf_endpoint = STR(hf_endpoint) ? STR(hf_endpoint) : "https://huggingface.co";
    c->hf_token = STR(hf_token);
#undef STR
#undef RAW
    atomic_store(&g_cur, c);
    pthread_mutex_unlock(&g_mu);
}

const cm_config *cm_config_get(void) {
    pthread_once(&g_once, load);
    return atomic_load(&g_cur);
}

void cm_config_reload(void) {
    pthread_once(&g_once, load);
    load();
}

int cm_cache_dir(const char *override, const char *sub, char *out, size_t cap) {
    const cm_config *c = cm_config_get();
    int w;
    if (override) w = snprintf(out, cap, "%s", override);
    else if (c->xdg_cache_home) w = snprintf(out, cap, "%s/cumulo/%s", c->xdg_cache_home, sub);
    else if (c->home) w = snprintf(out, cap, "%s/.cache/cumulo/%s", c->home, sub);
    else return CM_ENOENT;
    return w < 0 || (size_t)w >= cap ? CM_ERANGE : 0;
}
