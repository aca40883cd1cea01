/*
 * test_hub.c: the pure rules of model references (src/hub/hub.c): names as
 * users type them, the Hub's listing (and hostile ones), which files a name
 * means (quants, multi-part files, preferences), and where they live.
 * The network half is exercised against a mock Hub in tests/sh/pull.sh.
 */
#include "test.h"

#include "base/base.h"
#include "hub/hub.h"

#include <stdlib.h>

static void test_parse_ref(void) {
    cm_hub_ref r;
    char err[256];
    CHECK(cm_hub_parse_ref("Qwen/Qwen3-0.6B-GGUF", &r, err, sizeof err) == 0);
    CHECK(!strcmp(r.repo, "Qwen/Qwen3-0.6B-GGUF") && !r.quant[0] && !r.file[0] && !strcmp(r.revision, "main"));
    CHECK(cm_hub_parse_ref("bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", &r, err, sizeof err) == 0);
    CHECK(!strcmp(r.repo, "bartowski/Llama-3.2-1B-Instruct-GGUF") && !strcmp(r.quant, "Q4_K_M"));
    CHECK(cm_hub_parse_ref("org/repo@v1.0:q8_0", &r, err, sizeof err) == 0);
    CHECK(!strcmp(r.revision, "v1.0") && !strcmp(r.quant, "q8_0"));
    CHECK(cm_hub_parse_ref("hf://org/repo/sub/dir/model-Q4_0.gguf", &r, err, sizeof err) == 0);
    CHECK(!strcmp(r.repo, "org/repo") && !strcmp(r.file, "sub/dir/model-Q4_0.gguf"));
    CHECK(cm_hub_parse_ref("hf://org/repo:Q4_0", &r, err, sizeof err) == 0 && !strcmp(r.quant, "Q4_0"));
    /* refused, each with a message */
    const char *bad[] = {"repo",
                         "org/",
                         "/repo",
                         "org/re po",
                         "org/../x",
                         "org/repo:",
                         "org/repo:Q4 0",
                         "org/repo/file.gguf",
                         "hf://org/repo/../../etc/passwd",
                         "hf://org/repo/a?b.gguf",
                         "org/repo@",
                         "-org/repo",
                         "org/repo:Q4_0:x"};
    for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++) {
        err[0] = 0;
        CHECKF(cm_hub_parse_ref(bad[i], &r, err, sizeof err) == CM_EINVAL && err[0], "'%s'", bad[i]);
    }
    char longname[2000];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    longname[10] = '/';
    CHECK(cm_hub_parse_ref(longname, &r, err, sizeof err) != 0);
}

static void test_is_ref(void) {
    CHECK(cm_hub_is_ref("org/repo"));
    CHECK(cm_hub_is_ref("org/repo:Q4_K_M"));
    CHECK(cm_hub_is_ref("hf://org/repo/x.gguf"));
    CHECK(!cm_hub_is_ref("models/x.gguf"));
    CHECK(!cm_hub_is_ref("x.gguf"));
    CHECK(!cm_hub_is_ref("../shared/models/stories260K-f32.gguf"));
    CHECK(!cm_hub_is_ref("/abs/path"));
    CHECK(!cm_hub_is_ref("a/b/c"));
    CHECK(!cm_hub_is_ref(""));
}

static void test_split_name(void) {
    int k, n;
    CHECK(cm_hub_split_name("Q/x-Q4_K_M-00002-of-00003.gguf", &k, &n) && k == 2 && n == 3);
    CHECK(!cm_hub_split_name("x-Q4_K_M.gguf", &k, &n));
    CHECK(!cm_hub_split_name("x-00004-of-00003.gguf", &k, &n));
    CHECK(!cm_hub_split_name("x-00000-of-00003.gguf", &k, &n));
    CHECK(!cm_hub_split_name("-00001-of-00003.gguf", &k, &n));
    CHECK(!cm_hub_split_name("x-0000a-of-00003.gguf", &k, &n));
}

static void test_listing(void) {
    const char *j =
        "[{\"type\":\"directory\",\"path\":\"sub\",\"oid\":\"x\",\"size\":0},"
        "{\"type\":\"file\",\"path\":\"README.md\",\"oid\":\"abc\",\"size\":12},"
        "{\"type\":\"file\",\"path\":\"m-Q4_0.gguf\",\"size\":5,\"lfs\":{\"oid\":"
        "\"AB01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01\",\"size\":123456789012,\"pointerSize\":134}},"
        "{\"type\":\"file\",\"path\":\"../evil.gguf\",\"size\":1},"
        "{\"type\":\"file\",\"path\":\"bad-oid.gguf\",\"size\":7,\"lfs\":{\"oid\":\"xyz\",\"size\":7}},"
        "{\"type\":\"file\",\"path\":42},"
        "{\"type\":\"file\",\"path\":\"neg.gguf\",\"size\":-5}]";
    cm_hub_file *f;
    size_t n;
    char err[256];
    CHECK(cm_hub_parse_listing(j, strlen(j), &f, &n, err, sizeof err) == 0);
    CHECK(n == 4);
    if (n == 4) {
        CHECK(!strcmp(f[0].path, "README.md") && f[0].size == 12 && !f[0].sha256[0]);
        CHECK(!strcmp(f[1].path, "m-Q4_0.gguf") && f[1].size == 123456789012ull);
        CHECK(!strcmp(f[1].sha256, "ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01"));
        CHECK(!strcmp(f[2].path, "bad-oid.gguf") && !f[2].sha256[0]);
        CHECK(!strcmp(f[3].path, "neg.gguf") && f[3].size == 0);
    }
    cm_free(f);
    const char *bad[] = {"", "{", "{\"a\":1}", "[1,2", "null"};
    for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++)
        CHECKF(cm_hub_parse_listing(bad[i], strlen(bad[i]), &f, &n, err, sizeof err) == CM_EFORMAT, "'%s'", bad[i]);
    CHECK(cm_hub_parse_listing("[]", 2, &f, &n, err, sizeof err) == 0 && n == 0);
    cm_free(f);
}

static size_t mk(cm_hub_file *f, const char *const *names, size_t n) {
    for (size_t i = 0; i < n; i++) {
        memset(&f[i], 0, sizeof f[i]);
        snprintf(f[i].path, sizeof f[i].path, "%s", names[i]);
    }
    return n;
}

static void test_choose(void) {
    cm_hub_file f[16];
    size_t pick[CM_HUB_MAX_PARTS], np;
    cm_hub_ref r;
    char err[700];
    const char *repo[] = {"README.md",
                          "m-Q4_K_S.gguf",
                          "m-Q4_K_M.gguf",
                          "m-Q8_0.gguf",
                          "m-IQ4_XS.gguf",
                          "big/m-F16-00002-of-00002.gguf",
                          "big/m-F16-00001-of-00002.gguf",
                          "m-q4_0.gguf"};
    size_t n = mk(f, repo, CM_ARRAY_LEN(repo));
    cm_hub_parse_ref("o/m", &r, NULL, 0);
    CHECK(cm_hub_choose(&r, f, n, pick, &np, err, sizeof err) == 0 && np == 1 && pick[0] == 2); /* Q4_K_M preferred */
    cm_hub_parse_ref("o/m:q8_0", &r, NULL, 0);
    CHECK(cm_hub_choose(&r, f, n, pick, &np, err, sizeof err) == 0 && np == 1 && pick[0] == 3);
    cm_hub_parse_ref("o/m:Q4_K", &r, NULL, 0); /* a whole token: neither Q4_K_S nor Q4_K_M */
    CHECK(cm_hub_choose(&r, f, n, pick, &np, err, sizeof err) == CM_ENOENT && strstr(err, "m-Q4_K_M.gguf"));
    cm_hub_parse_ref("o/m:Q4_0", &r, NULL, 0); /* case-insensitive */
    CHECK(cm_hub_choose(&r, f, n, pick, &np, err, sizeof err) == 0 && pick[0] == 7);
    cm_hub_parse_ref("o/m:XS", &r, NULL, 0); /* IQ4_XS: "XS" is a token after '_' */
    CHECK(cm_hub_choose(&r, f, n, pick, &np, err, sizeof err) == 0 && pick[0] == 4);
    cm_hub_parse_ref("o/m:F16", &r, NULL, 0); /* multi-part: both parts, in order */
    CHECK(cm_hub_choose(&r, f, n, pick, &np, err, sizeof err) == 0 && np == 2 && pick[0] == 6 && pick[1] == 5);
    cm_hub_parse_ref("hf://o/m/big/m-F16-00002-of-00002.gguf", &r, NULL, 0); /* naming part 2 brings both */
    CHECK(cm_hub_choose(&r, f, n, pick, &np, err, sizeof err) == 0 && np == 2 && pick[0] == 6);
    cm_hub_parse_ref("hf://o/m/nope.gguf", &r, NULL, 0);
    CHECK(cm_hub_choose(&r, f, n, pick, &np, err, sizeof err) == CM_ENOENT && strstr(err, "no file 'nope.gguf'"));
    /* a missing part */
    n = mk(f, (const char *[]){"x-Q2_K-00001-of-00003.gguf", "x-Q2_K-00003-of-00003.gguf"}, 2);
    cm_hub_parse_ref("o/x:Q2_K", &r, NULL, 0);
    CHECK(cm_hub_choose(&r, f, n, pick, &np, err, sizeof err) == CM_ENOENT && strstr(err, "part 2 of 3"));
    /* several, none preferred: the user must choose */
    n = mk(f, (const char *[]){"a-Q5_K_M.gguf", "a-Q6_K.gguf"}, 2);
    cm_hub_parse_ref("o/a", &r, NULL, 0);
    CHECK(cm_hub_choose(&r, f, n, pick, &np, err, sizeof err) == CM_ENOENT && strstr(err, "2 files"));
    /* nothing to run */
    n = mk(f, (const char *[]){"model.safetensors", "README.md"}, 2);
    CHECK(cm_hub_choose(&r, f, n, pick, &np, err, sizeof err) == CM_ENOENT && strstr(err, "no GGUF"));
}

static void test_models_dir(void) {
    char d[512], err[128];
    setenv("CUMULO_MODELS", "/x/models", 1);
    cm_config_reload();
    CHECK(cm_models_dir(d, sizeof d, err, sizeof err) == 0 && !strcmp(d, "/x/models"));
    unsetenv("CUMULO_MODELS");
    cm_config_reload();
    setenv("XDG_CACHE_HOME", "/c", 1);
    cm_config_reload();
    CHECK(cm_models_dir(d, sizeof d, err, sizeof err) == 0 && !strcmp(d, "/c/cumulo/models"));
    unsetenv("XDG_CACHE_HOME");
    cm_config_reload();
    setenv("HOME", "/h", 1);
    cm_config_reload();
    CHECK(cm_models_dir(d, sizeof d, err, sizeof err) == 0 && !strcmp(d, "/h/.cache/cumulo/models"));
    CHECK(cm_models_file_path("/m", "o/r", "a/b.gguf", d, sizeof d) == 0 && !strcmp(d, "/m/o/r/a/b.gguf"));
    CHECK(cm_models_file_path("/m", "o/r", "a/b.gguf", d, 5) != 0);
}

int main(void) {
    RUN(test_parse_ref);
    RUN(test_is_ref);
    RUN(test_split_name);
    RUN(test_listing);
    RUN(test_choose);
    RUN(test_models_dir);
    TEST_END();
}
