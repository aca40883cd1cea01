/*
 * test_power.c: the power meter (os.h, power.c) on fake powercap and
 * /proc/stat trees: RAPL packages summed (sub-zones not double counted),
 * counter wrap-around at max_energy_range_uj, fallback to an estimate labelled
 * as such when there are no counters or they vanish, the estimate following
 * CPU load x TDP, and the joules/token helpers.
 */
#include "base/base.h"
#include "os/os.h"
#include "test.h"

#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static void put(const char *rel, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}
static void dir(const char *rel) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    mkdir(p, 0700);
}

static void test_rapl_sum_and_wrap(void) {
    dir("intel-rapl:0");
    dir("intel-rapl:0:0");
    dir("intel-rapl:1");
    put("intel-rapl:0/energy_uj", "999000000\n");
    put("intel-rapl:0/max_energy_range_uj", "1000000000\n");
    put("intel-rapl:0:0/energy_uj", "5\n"); /* sub-zone: must be ignored */
    put("intel-rapl:1/energy_uj", "100\n");
    put("intel-rapl:1/max_energy_range_uj", "1000000000\n");
    setenv("CUMULO_POWERCAP_ROOT", root, 1);
    cm_config_reload();
    cm_power_meter *m = cm_power_open(50);
    CHECK(m != NULL);
    /* package 0 wraps: 999 J -> 1000 J (max) -> 2 J, i.e. +3 J; package 1: +4 J. */
    put("intel-rapl:0/energy_uj", "2000000\n");
    put("intel-rapl:0:0/energy_uj", "900000000\n");
    put("intel-rapl:1/energy_uj", "4000100\n");
    cm_power_sample s;
    CHECK(cm_power_read(m, &s) == 0);
    CHECK(s.measured && !strcmp(s.source, "rapl"));
    CHECKF(fabs(s.joules - 7.0) < 1e-9, "joules %f", s.joules);
    CHECK(s.watts > 0);
    put("intel-rapl:1/energy_uj", "5000100\n");
    CHECK(cm_power_read(m, &s) == 0);
    CHECKF(fabs(s.joules - 8.0) < 1e-9, "joules %f", s.joules);
    /* Counters that disappear: an estimate, labelled, and CM_EIO once. */
    char p[512];
    snprintf(p, sizeof p, "%s/intel-rapl:1/energy_uj", root);
    unlink(p);
    CHECK(cm_power_read(m, &s) == CM_EIO);
    CHECK(!s.measured && !strcmp(s.source, "estimate"));
    CHECK(cm_power_read(m, &s) == 0 && !s.measured);
    cm_power_close(m);
}

static void test_estimate_from_load(void) {
    char empty[300];
    snprintf(empty, sizeof empty, "%s/none", root);
    setenv("CUMULO_POWERCAP_ROOT", empty, 1);
    cm_config_reload();
    char stat[300];
    snprintf(stat, sizeof stat, "%s/stat", root);
    setenv("CUMULO_PROC_STAT", stat, 1);
    cm_config_reload();
    put("stat", "cpu 100 0 100 800 0 0 0 0\ncpu0 1 2 3 4\n");
    cm_power_meter *m = cm_power_open(100);
    /* +300 busy, +100 idle: load 0.75 -> 100 * (0.2 + 0.8 * 0.75) = 80 W */
    put("stat", "cpu 300 0 200 900 0 0 0 0\n");
    cm_power_sample s;
    CHECK(cm_power_read(m, &s) == 0);
    CHECK(!s.measured && !strcmp(s.source, "estimate"));
    CHECKF(fabs(s.cpu_load - 0.75) < 1e-9, "load %f", s.cpu_load);
    CHECKF(fabs(s.watts - 80.0) < 1e-9, "watts %f", s.watts);
    cm_power_close(m);
    unsetenv("CUMULO_PROC_STAT");
    cm_config_reload();
    CHECK(fabs(cm_power_joules_per_token(10, 4) - 2.5) < 1e-12);
    CHECK(cm_power_joules_per_token(10, 0) == 0);
    CHECK(fabs(cm_power_tokens_per_watt(50, 25) - 2.0) < 1e-12);
    CHECK(cm_power_tokens_per_watt(50, 0) == 0);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/cumulo-power-%d", (int)getpid());
    mkdir(root, 0700);
    RUN(test_rapl_sum_and_wrap);
    RUN(test_estimate_from_load);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) {}
    TEST_END();
}
