/*
 * cpu.c: runtime CPU feature detection, so one binary picks the best kernels
 * on every machine of a mixed cluster (no -march=native anywhere).
 */
#include "os.h"

#include "../base/base.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__linux__) && defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1 << 10)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
#endif
#if defined(__APPLE__)
#include <sys/sysctl.h>
#endif

static cm_cpu_features g_feat;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__)
static uint64_t xgetbv0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

/* "" when this process may use AMX-INT8 tiles, else why not. Asks Linux
 * for the tile data state once (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA): the grant covers every thread of the process, those
 * started later included. */
static const char *amx_detect(uint64_t xcr0) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return "no CPUID leaf 7";
    if (!(d & (1u << 24)) || !(d & (1u << 25))) return "the CPU has no AMX-TILE/AMX-INT8";
    if ((xcr0 & (3u << 17)) != (3u << 17)) return "the OS does not enable tile state (XCR0)";
#if defined(__linux__)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
        return "Linux refused the tile data permission (arch_prctl)";
    return "";
#else
    return "AMX is used on Linux only";
#endif
}
#endif

static void detect(void) {
    memset(&g_feat, 0, sizeof g_feat);
    g_feat.x86_amx_why = "not an x86-64 build";
#if defined(__x86_64__)
    unsigned a, b, c, d;
    g_feat.x86_amx_why = "no CPUID";
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = c & (1u << 27);
    bool avx = c & (1u << 28);
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm_ok = (xcr0 & 6) == 6;
    bool zmm_ok = (xcr0 & 0xe6) == 0xe6;
    g_feat.x86_fma = avx && ymm_ok && (c & (1u << 12));
    g_feat.x86_f16c = avx && ymm_ok && (c & (1u << 29));
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        g_feat.x86_avx2 = avx && ymm_ok && (b & (1u << 5));
        g_feat.x86_avx512f = zmm_ok && (b & (1u << 16));
        g_feat.x86_avx512bw = g_feat.x86_avx512f && (b & (1u << 30));
        g_feat.x86_avx512vl = g_feat.x86_avx512f && (b & (1u << 31));
        g_feat.x86_avx512vnni = g_feat.x86_avx512f && (c & (1u << 11));
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
        g_feat.x86_avxvnni = ymm_ok && (a & (1u << 4));
        g_feat.x86_avx512bf16 = g_feat.x86_avx512f && (a & (1u << 5));
    }
    g_feat.x86_amx_why = amx_detect(xcr0);
    g_feat.x86_amx_int8 = !*g_feat.x86_amx_why;
#elif defined(__aarch64__)
    g_feat.arm_neon = true;
#if defined(__linux__)
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    g_feat.arm_dotprod = hw & HWCAP_ASIMDDP;
    g_feat.arm_fp16 = hw & HWCAP_ASIMDHP;
    g_feat.arm_i8mm = hw2 & HWCAP2_I8MM;
#elif defined(__APPLE__)
    int v = 0;
    size_t len = sizeof v;
    if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &len, NULL, 0) == 0) g_feat.arm_dotprod = v;
    len = sizeof v;
    v = 0;
    if (sysctlbyname("hw.optional.arm.FEAT_I8MM", &v, &len, NULL, 0) == 0) g_feat.arm_i8mm = v;
    len = sizeof v;
    v = 0;
    if (sysctlbyname("hw.optional.arm.FEAT_FP16", &v, &len, NULL, 0) == 0) g_feat.arm_fp16 = v;
#endif
#endif
}

const cm_cpu_features *cm_cpu_features_get(void) {
    pthread_once(&g_once, detect);
    return &g_feat;
}

int cm_cpu_feature_names(const char **names, int max) {
    const cm_cpu_features *f = cm_cpu_features_get();
    const struct {
        bool on;
        const char *name;
    } feats[] = {{f->x86_avx2, "avx2"},
                 {f->x86_fma, "fma"},
                 {f->x86_f16c, "f16c"},
                 {f->x86_avx512f, "avx512f"},
                 {f->x86_avx512bw, "avx512bw"},
                 {f->x86_avx512vl, "avx512vl"},
                 {f->x86_avx512vnni, "avx512vnni"},
                 {f->x86_avx512bf16, "avx512bf16"},
                 {f->x86_avxvnni, "avxvnni"},
                 {f->x86_amx_int8, "amx_int8"},
                 {f->arm_neon, "neon"},
                 {f->arm_dotprod, "dotprod"},
                 {f->arm_i8mm, "i8mm"},
                 {f->arm_fp16, "fp16"}};
    int n = 0;
    for (size_t i = 0; i < sizeof feats / sizeof feats[0] && n < max; i++)
        if (feats[i].on) names[n++] = feats[i].name;
    return n;
}

const char *cm_cpu_isa_cap(void) { return cm_config_get()->isa; }

uint64_t cm_cpu_l2_bytes(void) {
#if defined(__linux__)
    for (int i = 0; i < 8; i++) {
        char path[96], line[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (!f) break;
        const bool l2 = fgets(line, sizeof line, f) && atoi(line) == 2;
        fclose(f);
        if (!l2) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!(f = fopen(path, "r"))) return 0;
        uint64_t v = 0;
        if (fgets(line, sizeof line, f)) {
            char *e;
            v = strtoull(line, &e, 10);
            v *= *e == 'K' ? 1024u : *e == 'M' ? 1024u * 1024u : 1u;
        }
        fclose(f);
        return v;
    }
    return 0;
#elif defined(__APPLE__)
    uint64_t v = 0;
    size_t len = sizeof v;
    return sysctlbyname("hw.l2cachesize", &v, &len, NULL, 0) == 0 ? v : 0;
#else
    return 0;
#endif
}

void cm_cpu_signature(char *out, size_t cap) {
    if (!cap) return;
    char id[80] = "unknown";
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d)) {
        char vendor[13];
        memcpy(vendor, &b, 4), memcpy(vendor + 4, &d, 4), memcpy(vendor + 8, &c, 4);
        vendor[12] = 0;
        for (int i = 0; i < 12; i++)
            if (vendor[i] < 0x21 || vendor[i] > 0x7e) vendor[i] = '_';
        unsigned fam = 0, model = 0, step = 0;
        if (__get_cpuid(1, &a, &b, &c, &d)) {
            fam = (a >> 8) & 0xf, model = (a >> 4) & 0xf, step = a & 0xf;
            if (fam == 0xf) fam += (a >> 20) & 0xff;
            if (fam == 0x6 || fam >= 0xf) model |= ((a >> 16) & 0xf) << 4;
        }
        snprintf(id, sizeof id, "%s %u %u %u", vendor, fam, model, step);
    }
#elif defined(__aarch64__)
    snprintf(id, sizeof id, "arm64");
#endif
    const char *names[32];
    const int nf = cm_cpu_feature_names(names, 32);
    size_t o = (size_t)snprintf(out, cap, "%s;", id);
    for (int i = 0; i < nf && o < cap; i++) o += (size_t)snprintf(out + o, cap - o, " %s", names[i]);
    if (o < cap)
        snprintf(out + o, cap - o, "; l2 %llu; cpus %d", (unsigned long long)cm_cpu_l2_bytes(), cm_cpu_count());
}

uint64_t cm_thread_cpu_ns(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)) return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
