/*
 * power.c: watts and joules of this machine, measured where the OS exposes
 * energy counters (Linux RAPL through powercap) and otherwise estimated from
 * CPU load and a TDP — always labelled which. Also the CPU busy fraction the
 * estimate and the dashboard use.
 *
 * Reads only small sysfs/procfs files; never writes anything and never needs
 * root to work (unreadable counters simply mean "estimate"). The powercap root
 * can be redirected with CUMULO_POWERCAP_ROOT and /proc/stat with
 * CUMULO_PROC_STAT, so tests run on fake trees.
 */
#include "os.h"

#include "../base/base.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__APPLE__)
#include <unistd.h>
#endif

#define MAX_ZONES 16

struct cm_power_meter {
    double tdp_w;
    int n_zones;
    char zone[MAX_ZONES][512]; /* directory of each top-level RAPL package */
    uint64_t last_uj[MAX_ZONES];
    uint64_t max_uj[MAX_ZONES];
    double last_t;
    double joules;
    uint64_t cpu_busy, cpu_total; /* last /proc/stat totals */
};

static bool read_u64(const char *dir, const char *name, uint64_t *v) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    unsigned long long x = 0;
    bool ok = fscanf(f, "%llu", &x) == 1;
    fclose(f);
    *v = x;
    return ok;
}

/* Top-level packages only ("intel-rapl:0", not the sub-zone "intel-rapl:0:0",
 * whose energy is already part of its package). */
static bool is_package(const char *name) {
    const char *p = "intel-rapl:";
    if (strncmp(name, p, strlen(p))) return false;
    const char *q = name + strlen(p);
    if (!*q) return false;
    for (; *q; q++)
        if (*q < '0' || *q > '9') return false;
    return true;
}

static void rapl_open(cm_power_meter *m) {
    const char *root = cm_config_get()->powercap_root;
    DIR *d = opendir(root);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) && m->n_zones < MAX_ZONES) {
        if (!is_package(de->d_name)) continue;
        char *dir = m->zone[m->n_zones];
        snprintf(dir, sizeof m->zone[0], "%s/%s", root, de->d_name);
        uint64_t e, mx = 0;
        if (!read_u64(dir, "energy_uj", &e)) continue; /* unreadable (root-only since 2020 kernels) */
        if (!read_u64(dir, "max_energy_range_uj", &mx)) mx = 0;
        m->last_uj[m->n_zones] = e;
        m->max_uj[m->n_zones] = mx;
        m->n_zones++;
    }
    closedir(d);
}

/* Busy and total jiffies of all CPUs; false when unknown. */
static bool cpu_times(uint64_t *busy, uint64_t *total) {
#if defined(__linux__)
    FILE *f = fopen(cm_config_get()->proc_stat, "r");
    if (!f) return false;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                   &v[7]);
    fclose(f);
    if (n < 4) return false;
    uint64_t t = 0;
    for (int i = 0; i < 8; i++) t += v[i];
    *total = t;
    *busy = t - v[3] - v[4]; /* minus idle and iowait */
    return true;
#else
    (void)busy;
    (void)total;
    return false;
#endif
}

cm_power_meter *cm_power_open(double tdp_w) {
    cm_power_meter *m = cm_calloc(1, sizeof *m);
    if (!m) return NULL;
    m->tdp_w = tdp_w > 0 ? tdp_w : 65.0;
    rapl_open(m);
    cpu_times(&m->cpu_busy, &m->cpu_total);
    m->last_t = cm_now_s();
    return m;
}

void cm_power_close(cm_power_meter *m) { cm_free(m); }

static double cpu_load_since(cm_power_meter *m) {
    uint64_t b, t;
    if (cpu_times(&b, &t)) {
        double load = -1;
        if (t > m->cpu_total && b >= m->cpu_busy) load = (double)(b - m->cpu_busy) / (double)(t - m->cpu_total);
        m->cpu_busy = b;
        m->cpu_total = t;
        return load < 0 ? -1 : load > 1 ? 1 : load;
    }
#if defined(__APPLE__)
    double la[1];
    if (getloadavg(la, 1) == 1) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        double l = nc > 0 ? la[0] / (double)nc : -1;
        return l > 1 ? 1 : l;
    }
#endif
    return -1;
}

int cm_power_read(cm_power_meter *m, cm_power_sample *out) {
    double now = cm_now_s();
    double dt = now - m->last_t;
    m->last_t = now;
    memset(out, 0, sizeof *out);
    out->cpu_load = cpu_load_since(m);
    int rc = 0;
    if (m->n_zones) {
        double uj = 0;
        for (int i = 0; i < m->n_zones; i++) {
            uint64_t e;
            if (!read_u64(m->zone[i], "energy_uj", &e)) {
                rc = CM_EIO;
                break;
            }
            uint64_t prev = m->last_uj[i];
            /* The counter wraps at max_energy_range_uj back to 0. */
            uint64_t d = e >= prev ? e - prev : (m->max_uj[i] > prev ? m->max_uj[i] - prev + e : e);
            uj += (double)d;
            m->last_uj[i] = e;
        }
        if (!rc) {
            double j = uj / 1e6;
            m->joules += j;
            out->joules = m->joules;
            out->watts = dt > 0 ? j / dt : 0;
            out->measured = true;
            out->source = "rapl";
            return 0;
        }
        m->n_zones = 0; /* counters went away: estimate from now on */
    }
    double load = out->cpu_load < 0 ? 0.5 : out->cpu_load;
    /* A machine idles at roughly a fifth of its TDP; the rest scales with load. */
    out->watts = m->tdp_w * (0.2 + 0.8 * load);
    m->joules += out->watts * (dt > 0 ? dt : 0);
    out->joules = m->joules;
    out->measured = false;
    out->source = "estimate";
    return rc;
}

double cm_power_joules_per_token(double joules, double tokens) { return tokens > 0 ? joules / tokens : 0; }
double cm_power_tokens_per_watt(double tokens_per_s, double watts) { return watts > 0 ? tokens_per_s / watts : 0; }
